"""Scan, diff, apply: bring one index in step with the workspace.

A file whose (mtime, size) match the index is not opened. A changed file is read, hashed, and if
its hash moved, re-chunked; chunks whose text is unchanged keep their rows and vectors (only their
line numbers move). A changed transcript (source "sessions") is read from where the last sync
stopped when it only grew (`clawmem_index.sources.sessions`). Each file is applied in one transaction, so a
crash at any point leaves an index that is consistent and converges on the next run.

Files are read and chunked by clawmem_index.engine.parse; vectors for the new chunks come after, from
clawmem_index.engine.embed.
"""

from __future__ import annotations

import itertools
import operator
import re
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import xxhash

from clawmem_index.config import Settings
from clawmem_index.engine.parse import ParsedFile, ParsedSession, Progress, parse_all, parse_session
from clawmem_index.errors import StoreError
from clawmem_index.index.interface import IndexStore
from clawmem_index.index.store import FileRow
from clawmem_index.sources.paths import file_date, folder_date, is_profile_path
from clawmem_index.sources.sessions import describe_malformed, describe_oversized
from clawmem_index.sources.workspace import (
    MemoryFile,
    Skipped,
    path_key,
    scan,
    source_scope,
    stat_memory_file,
    stat_session_file,
)
from clawmem_index.text.keywords import index_text

__all__ = ["ChunkIds", "Progress", "SyncReport", "sync_workspace"]


# A folder or name below the source that starts with a year, and the month and day after it (2026/11/25, 2026-11).
GROWING_ALONE = 64  # a growing first index's files committed one by one: searchable as soon as each is
GROWING_BATCH = 256  # ... and the rest this many per transaction (a commit per file costs a cold index time)
_DATED = re.compile(r"/((?:19|20)\d\d)(?!\d)(?:[-_./](\d\d?)(?!\d))?(?:[-_./](\d\d?)(?!\d))?")
DATING = "folders"  # meta `dating`: the index's chunks are dated by names and year/month/day folders (file_date)


@dataclass
class SyncReport:
    files_seen: int = 0
    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    touched: int = 0
    chunks_added: int = 0
    chunks_removed: int = 0
    chunks_kept: int = 0
    bytes_read: int = 0
    malformed_lines: int = 0  # transcript lines skipped as not JSON or not a transcript line (each also in `skipped`)
    embedded: int = 0  # chunks given a vector by the provider
    from_cache: int = 0  # chunks given a vector the index already had (a rebuild or model switch)
    embed_error: str | None = None
    batch_jobs: int = 0  # provider batch jobs still running when the run ended
    batch_chunks: int = 0  # chunk texts those jobs will embed
    batch_notes: list[str] = field(default_factory=list)  # jobs that failed, timed out or came back short
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "path: reason": looks like memory, not indexed
    duration: float = 0.0
    scope: frozenset[str] | None = None  # the index keys a pass over some files looked at (None: the workspace)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed)

    def as_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, list) else v for k, v in self.__dict__.items() if k != "scope"}


def _stat_source_file(settings: Settings, key: str, skipped: list[Skipped]) -> MemoryFile | None:
    """One file of the configured sources by its index key (a targeted sync), None if it is no such file now."""
    memory, sessions = source_scope(settings)
    if sessions is not None and sessions.names_of(key) is not None:
        return stat_session_file(sessions, key, skipped, settings.excluded, settings.refuse_hardlinks)
    if not memory:
        return None
    return stat_memory_file(settings.workspace, key, settings.extra_paths, skipped, settings.excluded,
                            settings.max_file_bytes, settings.refuse_hardlinks)


def sync_workspace(store: IndexStore, settings: Settings, *, progress: Progress | None = None,
                   bulk: bool = False, growing: bool = False, paths: Iterable[str] | None = None) -> SyncReport:
    """One pass over the workspace, or over just `paths` (index keys a watcher saw change).

    `bulk` groups many files per transaction (for a private rebuild file nobody reads yet); `growing`
    (a first index, written where readers search it as it grows) commits its first GROWING_ALONE files
    one by one (the curated memory and the latest days: `_recent_first`), then the rest in batches.
    """
    started = time.perf_counter()
    report = SyncReport()
    skipped: list[Skipped] = []
    if store.meta.get("dating") != DATING:
        _date_by_folders(store)
    if paths is None:
        memory, sessions = source_scope(settings)
        seen = store.file_stats()  # (mtime, size) only: whole rows are read for the files that changed
        found: Iterable[MemoryFile | None] = scan(settings.workspace, settings.extra_paths, skipped, settings.excluded,
                                                  memory=memory, sessions=sessions,
                                                  max_bytes=settings.max_file_bytes,
                                                  refuse_hardlinks=settings.refuse_hardlinks)
    else:
        wanted = {path_key(p) for p in paths}
        report.scope = frozenset(wanted)
        found = (_stat_source_file(settings, p, skipped) for p in sorted(wanted))
        seen = {p: (row.mtime, row.size) for p in wanted if (row := store.file_row(p)) is not None}
    on_disk, stale = _compare(found, seen)
    report.skipped = [str(s) for s in skipped]
    report.files_seen = len(on_disk)

    for path in sorted(seen.keys() - on_disk):
        with store.transaction():
            report.chunks_removed += store.delete_file(path)
        report.removed += 1

    stale = _recent_first(stale)  # only what changed is sorted: a no-change pass sorts nothing
    indexed = {f.path: row for f in stale if f.path in seen and (row := store.file_row(f.path)) is not None}
    report.unchanged = len(on_disk) - len(stale)
    if progress:
        progress(0, len(stale))

    per_transaction = 500 if bulk else 1
    batch: list[ParsedFile | ParsedSession] = []
    notes = [f for f in stale if f.source != "sessions"]
    transcripts = [f for f in stale if f.source == "sessions"]
    parsed = itertools.chain[ParsedFile | ParsedSession](
        parse_all(notes, settings, indexed, store.terms_of),
        (parse_session(f, settings, indexed.get(f.path)) for f in transcripts))
    unfinished: list[MemoryFile] = []  # transcripts whose read stopped at its budget
    for done, item in enumerate(parsed, start=1):
        batch.append(item)
        if isinstance(item, ParsedSession) and item.transcript is not None and not item.transcript.complete:
            unfinished.append(item.file)
        if growing:
            per_transaction = 1 if done < GROWING_ALONE else GROWING_BATCH
        if len(batch) >= per_transaction:
            _apply_batch(store, batch, indexed, report)
            batch = []
        if progress:
            progress(done, len(stale))
    if batch:
        _apply_batch(store, batch, indexed, report)
    for f in unfinished:
        _read_on(store, settings, f, report)
    report.duration = time.perf_counter() - started
    return report


def _read_on(store: IndexStore, settings: Settings, f: MemoryFile, report: SyncReport) -> None:
    """Read a long transcript on, one budget of bytes at a time, each committed before the next is read:
    a pass over a transcript of any size holds at most one budget's messages (`max_file_bytes`)."""
    for _ in range(f.size // max(1, settings.max_file_bytes) + 2):  # each read takes a budget or reaches the end
        previous = store.file_row(f.path)
        item = parse_session(f, settings, previous)
        _apply_batch(store, [item], {f.path: previous} if previous is not None else {}, report)
        if item.transcript is None or item.transcript.complete:
            return


def _date_by_folders(store: IndexStore) -> None:
    """Date the chunks of files an older clawmem indexed undated because their date is in their folders
    (`memory/2026/11/25.md`): from the paths alone, once per index (meta `dating`), no file read again."""
    dates = {path: day for path in store.file_stats() if folder_date(path) is not None
             and (day := file_date(path)) is not None}
    with store.transaction():
        store.date_undated(dates)
        store.meta.set("dating", DATING)


def _recent_first(files: list[MemoryFile]) -> list[MemoryFile]:
    """The order a pass indexes files in, and so (by chunk number) the order their vectors are made:
    the workspace's own files (MEMORY.md, USER.md, each person's users/<id>/USER.md) first, then dated
    ones (a folder or name below the source starting with a year: `memory/2026-11-26.md`,
    `memory/2026/11/25.md`), the latest first, then the rest by path. Dates of different layouts compare as
    dates (`_date_key`), not as strings.

    A first index or a rebuild for another model can leave chunks waiting hours for a local model
    (20,000 notes: ~3 h on two cores); meanwhile hybrid search covers the curated memory and the
    latest days, the notes an agent asks about most, instead of the oldest.
    """
    roots: list[MemoryFile] = []
    dated: list[tuple[tuple[int, int, int], str, MemoryFile]] = []
    rest: list[MemoryFile] = []
    for f in files:
        if "/" not in f.path or is_profile_path(f.path):
            roots.append(f)
        elif (found := _DATED.search(f.path)) is not None:
            dated.append((_date_key(f.path, found), f.path, f))
        else:
            rest.append(f)
    dated.sort(reverse=True)
    by_path = operator.attrgetter("path")
    return sorted(roots, key=by_path) + [f for _, _, f in dated] + sorted(rest, key=by_path)


def _date_key(path: str, found: re.Match[str]) -> tuple[int, int, int]:
    """A dated file's (year, month, day), 0 for a part its path does not give: its date (`file_date`),
    else the year, month and day `found` after a folder (`2026/11/`, `2026.11.26`)."""
    day = file_date(path)
    year, month, mday = day.split("-") if day is not None else found.groups()
    return int(year), int(month or 0), int(mday or 0)


def _compare(found: Iterable[MemoryFile | None],
             seen: dict[str, tuple[int, int]]) -> tuple[set[str], list[MemoryFile]]:
    """The keys of the files found, and those whose (mtime, size) differ from what the index saw.

    Only the changed files are kept (as the keys alone, in a set of strings, the others are not
    tracked by the garbage collector: keeping 100,000 `MemoryFile`s made a no-change pass pay ~0.1 s of
    collections).
    """
    present: set[str] = set()
    stale: list[MemoryFile] = []
    for f in found:
        if f is None:
            continue
        present.add(f.path)
        if seen.get(f.path) != (f.mtime_ns, f.size):
            stale.append(f)
    return present, stale


def _apply_batch(store: IndexStore, batch: Sequence[ParsedFile | ParsedSession], indexed: dict[str, FileRow],
                 report: SyncReport) -> None:
    """Apply parsed files, each in a savepoint of its own: one that fails is left as it was, never the others.

    What fails is reported (`errors`) and tried again by the next sync, since its file row is not
    updated: a file that can not be indexed never stops the index of the rest, nor passes as fresh.
    """
    with store.transaction():
        for item in batch:
            previous = indexed.get(item.file.path)
            before = replace(report, errors=list(report.errors), skipped=list(report.skipped))
            try:
                with store.transaction():
                    if _unreadable(store, item, previous, report):
                        continue
                    if isinstance(item, ParsedSession):
                        _apply_session(store, item, previous, report)
                    else:
                        _apply_file(store, item, previous, report)
            # What the store refused for this file, or what its text did to the code (a full disk is no file's: it
            # stops the run, as the backend's `writing` says)
            except (StoreError, UnicodeError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
                report.__dict__.update(before.__dict__)  # the savepoint undid what was counted
                detail = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
                report.errors.append(f"{item.file.path}: not indexed ({detail})")


def _unreadable(store: IndexStore, item: ParsedFile | ParsedSession, previous: FileRow | None,
                report: SyncReport) -> bool:
    """Not readable as a regular file now: whatever the index held for it can no longer be served."""
    if not item.refused and item.error is None:
        return False
    if item.error is not None:
        (report.skipped if item.refused else report.errors).append(f"{item.file.path}: {item.error}")
    if previous is not None:
        report.chunks_removed += store.delete_file(item.file.path)
        report.removed += 1
    return True


def _apply_session(store: IndexStore, item: ParsedSession, previous: FileRow | None, report: SyncReport) -> None:
    """Add the chunks of a transcript's new messages; a transcript read whole replaces all of its chunks first."""
    f, transcript = item.file, item.transcript
    assert transcript is not None
    report.bytes_read += transcript.bytes_read
    if transcript.malformed_lines:
        report.malformed_lines += len(transcript.malformed_lines)
        report.skipped.append(f"{f.path}: {describe_malformed(transcript.malformed_lines)}")
    if transcript.oversized_lines:
        report.skipped.append(f"{f.path}: {describe_oversized(transcript.oversized_lines, item.max_bytes)}")
    if transcript.whole:
        report.chunks_removed += store.delete_file(f.path)
    elif transcript.rewindow_from is not None:
        report.chunks_removed += store.delete_chunks_from(f.path, transcript.rewindow_from)
    base = xxhash.xxh3_64_hexdigest(f.path.encode("utf-8", "surrogatepass"))
    for n, chunk in enumerate(item.chunks):
        # New chunks start after every line of the chunks kept, so the start line keeps ids unique.
        store.insert_chunk(id=f"{base}:{chunk.hash}:{chunk.start_line}:{n}", path=f.path, source="sessions",
                           start_line=chunk.start_line, end_line=chunk.end_line, hash=chunk.hash, text=chunk.text,
                           fts_text=index_text(chunk.text), date=chunk.date)
    report.chunks_added += len(item.chunks)
    state = transcript.state
    # A read stopped at its budget records the size it reached: the file is seen as changed, and read on from there.
    size = f.size if transcript.complete else state.offset
    store.upsert_file(FileRow(f.path, "sessions", f"{state.offset}:{state.tail}", f.mtime_ns, size,
                              state.to_json()))
    if previous is None:
        report.added += 1
    elif transcript.whole or item.chunks:
        report.updated += 1
    else:
        report.touched += 1


def _apply_file(store: IndexStore, item: ParsedFile, previous: FileRow | None, report: SyncReport) -> None:
    f = item.file
    report.bytes_read += item.size
    row = FileRow(f.path, f.source, item.hash, f.mtime_ns, f.size)
    if previous is not None and previous.hash == item.hash:
        store.upsert_file(row)
        report.touched += 1
        return
    date = file_date(f.path)
    old = store.chunks_of(f.path) if previous is not None else []  # a file's chunks go with its row
    reusable: dict[str, deque[int]] = {}
    by_seq = {c.seq: c for c in old}
    for c in old:
        reusable.setdefault(c.hash, deque()).append(c.seq)
    kept: set[int] = set()
    ids = ChunkIds(f.path)
    for n, chunk in enumerate(item.chunks):
        seqs = reusable.get(chunk.hash)
        if seqs:
            seq = seqs.popleft()
            kept.add(seq)
            prev = by_seq[seq]
            ids.keep(prev.id)
            if (prev.start_line, prev.end_line) != (chunk.start_line, chunk.end_line):
                store.move_chunk(seq, chunk.start_line, chunk.end_line)
            report.chunks_kept += 1
            continue
        store.insert_chunk(id=ids.new(chunk.hash), path=f.path, source=f.source, start_line=chunk.start_line,
                           end_line=chunk.end_line, hash=chunk.hash, text=chunk.text, fts_text=item.fts_texts[n],
                           date=date, terms=None if item.terms is None else item.terms[n],
                           annotations=item.annotations[n] if item.annotations else None)
        report.chunks_added += 1
    dropped = [seq for seq in by_seq if seq not in kept]
    store.delete_chunks(dropped)
    report.chunks_removed += len(dropped)
    store.upsert_file(row)
    if previous is None:
        report.added += 1
    else:
        report.updated += 1


class ChunkIds:
    """A file's chunk ids: `<path hash>:<text hash>:<copy number>`, unique within the index.

    Kept chunks keep their ids; a new chunk takes the lowest copy number of its text not yet taken
    (so a file of k identical chunks numbers them 0..k-1). Each text remembers where its search
    stopped: k copies cost O(k) tries in all, where searching from 0 each time cost O(k^2).
    """

    def __init__(self, path: str) -> None:
        self._base = xxhash.xxh3_64_hexdigest(path.encode("utf-8", "surrogatepass"))
        self._taken: set[str] = set()
        self._next: dict[str, int] = {}
        self.tries = 0

    def keep(self, chunk_id: str) -> None:
        self._taken.add(chunk_id)

    def new(self, text_hash: str) -> str:
        n = self._next.get(text_hash, 0)
        while True:
            self.tries += 1
            chunk_id = f"{self._base}:{text_hash}:{n}"
            if chunk_id not in self._taken:
                break
            n += 1
        self._next[text_hash] = n + 1
        self._taken.add(chunk_id)
        return chunk_id

