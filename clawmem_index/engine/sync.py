"""Scan, diff, apply: bring one index in step with the workspace.

A file whose (mtime, size) match the index is not opened. A changed file is read, hashed, and if
its hash moved, re-chunked; chunks whose text is unchanged keep their rows and vectors (only their
line numbers move). A changed transcript (source "sessions") is read from where the last sync
stopped when it only grew (`clawmem_index.sources.sessions`). Each file is applied in one transaction, so a
crash at any point leaves an index that is consistent and converges on the next run.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import apsw
import xxhash

from clawmem_index.text.chunking import Chunk, chunk_markdown
from clawmem_index.config import Settings
from clawmem_index.embeddings.base import EmbeddingProvider, pack, unit
from clawmem_index.embeddings.batching import in_flight
from clawmem_index.errors import PathError, ProviderError
from clawmem_index.sources.files import open_beneath, read_all, refusal_of
from clawmem_index.text.keywords import index_text
from clawmem_index.sources.sessions import (
    SessionChunk,
    TailState,
    Transcript,
    TranscriptReader,
    chunk_transcript,
    describe_malformed, describe_oversized,
    read_transcript,
)
from clawmem_index.index.store import FileRow, Store
from clawmem_index.sources.paths import file_date, folder_date
from clawmem_index.sources.workspace import (
    MemoryFile,
    Skipped,
    path_key,
    scan,
    size_reason,
    source_scope,
    stat_memory_file,
    stat_session_file,
)

__all__ = ["ChunkIds", "SyncReport", "embed_pending", "sync_workspace"]

Progress = Callable[[int, int], None]

# A folder or name below the source that starts with a year, and the month and day after it (2026/11/25, 2026-11).
_DATED = re.compile(r"/((?:19|20)\d\d)(?!\d)(?:[-_./](\d\d?)(?!\d))?(?:[-_./](\d\d?)(?!\d))?")
DATING = "folders"  # meta `dating`: the index's chunks are dated by names and year/month/day folders (file_date)
EMBED_BATCH = 64  # chunks per provider call and per vector transaction (progress moves once per batch)
# The first batch of a pass is small: its vectors (MEMORY.md's, the latest day's) land and the pass
# has a rate for its ETA within seconds, not after a full batch (128 chunks: ~16 s for a local model).
FIRST_BATCH = 16
PARALLEL_MIN_BYTES = 12 << 20  # below, workers would save 10-20% at twice to three times the memory (docs/benchmarks.md)
PARSE_BATCH = 32  # files per task sent to a chunking worker
PARSE_AHEAD = 16  # batches in flight per worker: enough to keep them busy, few enough to bound memory


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


@dataclass(frozen=True)
class ParsedFile:
    file: MemoryFile
    hash: str
    chunks: list[Chunk]
    size: int
    error: str | None = None
    refused: bool = False  # may not be read (now a symlink, FIFO...): `error` says why, None if it is just gone
    fts_texts: list[str] = field(default_factory=list)  # each chunk's text as the keyword index takes it
    terms: list[Any] | None = None  # the store's `terms_of` each of those (None: the store has none)


@dataclass(frozen=True)
class ParsedSession:
    """A transcript's new messages (or all of them, `transcript.whole`) as chunks, or why it was not read."""

    file: MemoryFile
    transcript: Transcript | None
    chunks: list[SessionChunk]
    error: str | None = None
    refused: bool = False
    max_bytes: int = 0  # the bound its read had (for the report)


def _stat_source_file(settings: Settings, key: str, skipped: list[Skipped]) -> MemoryFile | None:
    """One file of the configured sources by its index key (a targeted sync), None if it is no such file now."""
    memory, sessions = source_scope(settings)
    if sessions is not None and sessions.names_of(key) is not None:
        return stat_session_file(sessions, key, skipped, settings.exclude, settings.refuse_hardlinks)
    if not memory:
        return None
    return stat_memory_file(settings.workspace, key, settings.extra_paths, skipped, settings.exclude,
                            settings.max_file_bytes, settings.refuse_hardlinks)


def sync_workspace(store: Store, settings: Settings, *, progress: Progress | None = None,
                   bulk: bool = False, paths: Iterable[str] | None = None) -> SyncReport:
    """One pass over the workspace, or over just `paths` (index keys a watcher saw change).

    `bulk` groups many files per transaction (for a private rebuild file nobody reads yet).
    """
    started = time.perf_counter()
    report = SyncReport()
    skipped: list[Skipped] = []
    if store.get_meta("dating") != DATING:
        _date_by_folders(store)
    if paths is None:
        memory, sessions = source_scope(settings)
        seen = store.file_stats()  # (mtime, size) only: whole rows are read for the files that changed
        found: Iterable[MemoryFile | None] = scan(settings.workspace, settings.extra_paths, skipped, settings.exclude,
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
        _parse_all(notes, settings, indexed, store.terms_of), (_parse_session(f, settings, indexed.get(f.path)) for f in transcripts))
    unfinished: list[MemoryFile] = []  # transcripts whose read stopped at its budget
    for done, item in enumerate(parsed, start=1):
        batch.append(item)
        if isinstance(item, ParsedSession) and item.transcript is not None and not item.transcript.complete:
            unfinished.append(item.file)
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


def _read_on(store: Store, settings: Settings, f: MemoryFile, report: SyncReport) -> None:
    """Read a long transcript on, one budget of bytes at a time, each committed before the next is read:
    a pass over a transcript of any size holds at most one budget's messages (`max_file_bytes`)."""
    for _ in range(f.size // max(1, settings.max_file_bytes) + 2):  # each read takes a budget or reaches the end
        previous = store.file_row(f.path)
        item = _parse_session(f, settings, previous)
        _apply_batch(store, [item], {f.path: previous} if previous is not None else {}, report)
        if item.transcript is None or item.transcript.complete:
            return


def _date_by_folders(store: Store) -> None:
    """Date the chunks of files an older clawmem indexed undated because their date is in their folders
    (`memory/2026/11/25.md`): from the paths alone, once per index (meta `dating`), no file read again."""
    dates = {path: day for path in store.file_stats() if folder_date(path) is not None
             and (day := file_date(path)) is not None}
    with store.transaction():
        store.date_undated(dates)
        store.set_meta("dating", DATING)


def _recent_first(files: list[MemoryFile]) -> list[MemoryFile]:
    """The order a pass indexes files in, and so (by chunk number) the order their vectors are made:
    the workspace's own files (MEMORY.md) first, then dated ones (a folder or name below the source
    starting with a year: `memory/2026-11-26.md`, `memory/2026/11/25.md`), the latest first, then the
    rest by path. Dates of different layouts compare as dates (`_date_key`), not as strings.

    A first index or a rebuild for another model can leave chunks waiting hours for a local model
    (20,000 notes: ~3 h on two cores); meanwhile hybrid search covers the curated memory and the
    latest days, the notes an agent asks about most, instead of the oldest.
    """
    roots: list[MemoryFile] = []
    dated: list[tuple[tuple[int, int, int], str, MemoryFile]] = []
    rest: list[MemoryFile] = []
    for f in files:
        if "/" not in f.path:
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


def _apply_batch(store: Store, batch: Sequence[ParsedFile | ParsedSession], indexed: dict[str, FileRow],
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
            except (apsw.Error, UnicodeError, ValueError, OverflowError, MemoryError, RecursionError) as exc:
                if isinstance(exc, apsw.FullError):  # the disk's, not the file's: every later file would fail too
                    raise
                report.__dict__.update(before.__dict__)  # the savepoint undid what was counted
                report.errors.append(f"{item.file.path}: not indexed ({type(exc).__name__}: {exc})")


def _unreadable(store: Store, item: ParsedFile | ParsedSession, previous: FileRow | None,
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


def _apply_session(store: Store, item: ParsedSession, previous: FileRow | None, report: SyncReport) -> None:
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


def _apply_file(store: Store, item: ParsedFile, previous: FileRow | None, report: SyncReport) -> None:
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
                           date=date, terms=None if item.terms is None else item.terms[n])
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


def _parse_all(files: Sequence[MemoryFile], settings: Settings, indexed: dict[str, FileRow],
               terms_of: Callable[[str], Any] | None) -> Iterator[ParsedFile]:
    """Each file read and chunked, with what the keyword index makes of each chunk: in worker processes
    when there is enough to do, so that the writer only writes."""
    args = _ParseArgs(settings.chunking.tokens, settings.chunking.overlap, settings.chunking.tokenizer,
                      settings.refuse_hardlinks, terms_of, settings.max_file_bytes)
    total = sum(f.size for f in files)
    workers = min(os.cpu_count() or 1, 8)
    if workers > 1 and total >= PARALLEL_MIN_BYTES and len(files) >= 64:
        # Chunking is CPU-bound pure Python: a cold index of thousands of files is worth other cores.
        # "spawn" because the daemon has threads, which do not survive a fork safely.
        from collections import deque
        from concurrent.futures import Future, ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_warm_up,
                                 initargs=(settings.chunking.tokenizer,)) as pool:
            # A bounded window of batches in flight (not `map`, which submits every file at once and
            # keeps every parsed file the writer has not taken yet): memory stays flat in the file count.
            ahead: deque[Future[list[ParsedFile]]] = deque()
            for start in range(0, len(files), PARSE_BATCH):
                batch = files[start:start + PARSE_BATCH]
                ahead.append(pool.submit(_parse_batch, batch, args, [indexed.get(f.path) for f in batch]))
                if len(ahead) >= workers * PARSE_AHEAD:
                    yield from ahead.popleft().result()
            while ahead:
                yield from ahead.popleft().result()
        return
    for f in files:
        yield _parse_one(f, args, indexed.get(f.path))


@dataclass(frozen=True)
class _ParseArgs:
    max_tokens: int
    overlap: int
    tokenizer: str
    refuse_hardlinks: bool
    terms_of: Callable[[str], Any] | None  # a module-level function: it travels to the workers by name
    max_bytes: int = 0  # a file grown past this since the scan is not read (0: no limit)


def _parse_batch(files: Sequence[MemoryFile], args: _ParseArgs,
                 previous: Sequence[FileRow | None]) -> list[ParsedFile]:
    return [_parse_one(f, args, row) for f, row in zip(files, previous, strict=True)]


def _warm_up(tokenizer: str) -> None:
    """Load the tokenizer and parser while the parent is still scanning."""
    chunk_markdown("# warm\n- up", tokenizer=tokenizer)


def _parse_one(f: MemoryFile, args: _ParseArgs, previous: FileRow | None) -> ParsedFile:
    """Read one file through a descriptor opened beneath its root, and keep the stat of what was read."""
    try:
        with open_beneath(f.root, f.names, display=f.path, refuse_hardlinks=args.refuse_hardlinks) as opened:
            if args.max_bytes and opened.stat.st_size > args.max_bytes:
                return ParsedFile(f, "", [], 0, error=size_reason(opened.stat.st_size, args.max_bytes), refused=True)
            data = read_all(opened.fd)
            f = f.as_read(opened.stat)
    except PathError as exc:
        why = refusal_of(exc)
        if why is not None and why.missing:
            return ParsedFile(f, "", [], 0, refused=True)  # gone since the scan: just unindex it
        return ParsedFile(f, "", [], 0, error=why.reason if why else str(exc), refused=True)
    except OSError as exc:
        return ParsedFile(f, "", [], 0, error=f"cannot read: {exc.strerror or exc}")
    digest = xxhash.xxh3_128_hexdigest(data)
    if previous is not None and previous.hash == digest:
        return ParsedFile(f, digest, [], len(data))
    text = data.decode("utf-8", errors="replace")
    chunks = chunk_markdown(text, max_tokens=args.max_tokens, overlap=args.overlap, tokenizer=args.tokenizer)
    fts_texts = [index_text(chunk.text) for chunk in chunks]
    terms = None if args.terms_of is None else [args.terms_of(t) for t in fts_texts]
    return ParsedFile(f, digest, chunks, len(data), fts_texts=fts_texts, terms=terms)


def _parse_session(f: MemoryFile, settings: Settings, previous: FileRow | None) -> ParsedSession:
    """Read a transcript's new lines (all of them when it is not a pure append) through a counting reader."""
    chunking = settings.chunking
    params = (chunking.tokens, chunking.overlap, chunking.tokenizer)
    state = TailState.from_json(previous.state) if previous is not None and previous.source == "sessions" else None
    try:
        with open_beneath(f.root, f.names, display=f.path, refuse_hardlinks=settings.refuse_hardlinks) as opened:
            transcript = read_transcript(TranscriptReader(opened.fd, opened.stat.st_size), state, params,
                                         max_bytes=settings.max_file_bytes)
            f = f.as_read(opened.stat)
    except PathError as exc:
        why = refusal_of(exc)
        if why is not None and why.missing:
            return ParsedSession(f, None, [], refused=True)
        return ParsedSession(f, None, [], error=why.reason if why else str(exc), refused=True)
    except OSError as exc:
        return ParsedSession(f, None, [], error=f"cannot read: {exc.strerror or exc}")
    chunks, state = chunk_transcript(transcript, max_tokens=chunking.tokens, overlap=chunking.overlap,
                                     tokenizer=chunking.tokenizer)
    return ParsedSession(f, replace(transcript, state=state), chunks, max_bytes=settings.max_file_bytes)


@dataclass(frozen=True)
class _Batch:
    """Pending chunks read together, with what the cache has for them and the texts it lacks."""

    pending: list[tuple[int, str, str]]
    cached: dict[str, bytes]
    missing: dict[str, str]
    borrowed: frozenset[str] = frozenset()  # texts an earlier batch still in flight asks for


def embed_pending(store: Store, provider: EmbeddingProvider, *, cache_max_entries: int, batch: int = EMBED_BATCH,
                  progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                  fingerprint: str | None = None, cache_only: bool = False,
                  exclude: Collection[str] = (), index_progress: Progress | None = None,
                  precision: str = "float32") -> tuple[int, str | None]:
    """Give every chunk without a vector one, cache first. Returns (embedded, error or None).

    The provider is called outside any transaction (on a thread of its own, one batch ahead of the
    one being written), so other writers (keyword syncs) never wait for it and a batch's vectors are
    stored while the next batch's are made. Each batch is written in one short transaction that
    first checks the index still has `fingerprint` (a rebuild may have replaced it) and stores a
    vector only for a chunk that still waits for that very text. A provider failure stops the pass
    and leaves the rest pending (kept in the index, retried by the next pass): nothing is lost, and
    keyword search is unaffected. `cache_only` fills what the embedding cache knows and makes no
    provider call; chunks whose hash is in `exclude` (a batch job embeds them) are only filled from
    the cache. `progress` is told after each batch: FIRST_BATCH chunks first, then EMBED_BATCH, or the
    provider's `preferred_batch` when larger (a remote provider's requests in flight at once); `index_progress`
    about the vector index's upkeep at the end (a cells build past 131k vectors takes 30-65 s at 1M).
    `precision`: how a new vector table stores its vectors (`embedding.precision`).
    """
    info = provider.info
    key = info.provider_key
    size = max(batch, getattr(provider, "preferred_batch", batch))
    total = store.pending_embeddings()

    asked: set[str] = set()  # texts sent in this pass
    lent: set[str] = set()  # ... that a later batch waits for too
    made: dict[str, bytes | None] = {}  # the vectors of those, once they came back

    def batches() -> Iterator[_Batch]:  # read on this thread, as the pass goes
        cursor = 0
        first = True
        while not (should_stop and should_stop()):
            pending = store.pending_chunks(min(size, FIRST_BATCH) if first else size, after=cursor)
            first = False
            if not pending:
                return
            cursor = pending[-1][0]
            cached = store.cached_embeddings(info.provider, info.model, key, (h for _, h, _ in pending), touch=False)
            missing: dict[str, str] = {}
            borrowed: set[str] = set()
            for _, h, text in pending:
                if h in cached or h in exclude:
                    continue
                if h in asked:  # not in the cache yet because its batch is still in flight: never ask twice
                    borrowed.add(h)
                else:
                    missing.setdefault(h, text)
            if cache_only:
                missing, borrowed = {}, set()
            asked.update(missing)
            lent.update(borrowed)
            yield _Batch(pending, cached, missing, frozenset(borrowed))

    def fetch(item: _Batch) -> tuple[_Batch, dict[str, bytes | None]]:
        vectors = provider.embed_documents(list(item.missing.values())) if item.missing else []
        directions = (unit(vec) for vec in vectors)
        return item, {h: pack(d) if d is not None else None for h, d in zip(item.missing, directions, strict=True)}

    done = 0
    error: str | None = None
    try:
        for item, fresh in in_flight((functools.partial(fetch, item) for item in batches()), 2):
            made.update((h, blob) for h, blob in fresh.items() if h in lent)
            known = {**item.cached, **fresh, **{h: made[h] for h in item.borrowed if h in made}}
            with store.transaction():
                if fingerprint is not None and store.get_meta("fingerprint") != fingerprint:
                    break  # replaced by a rebuild for another model: these vectors belong to no chunk of it
                dims = next((len(blob) // 4 for blob in known.values() if blob is not None), 0)
                if dims:
                    store.ensure_vector_table(dims, precision)
                    store.set_vector_owner(info.provider, info.model, key)
                given = store.store_vectors([(seq, h, known[h]) for seq, h, _ in item.pending if h in known],
                                            info.model)
                done += len(given)
                given_seqs = {seq for seq, _ in given}
                held = {h for seq, h, _ in item.pending if seq in given_seqs}
                store.uncache(info.provider, info.model, key, held & item.cached.keys())  # stored once: in the chunk
                store.cache_embeddings(info.provider, info.model, key, (  # for a chunk that changed meanwhile,
                    # or every one when the cache is the fleet's (caches_stored_vectors)
                    (h, blob) for h, blob in fresh.items()
                    if blob is not None and (store.caches_stored_vectors or h not in held)))
            if progress and (given or not cache_only):  # a cache-only pass that found nothing has not moved
                progress(done, total)
    except ProviderError as exc:
        error = str(exc)
    if not (should_stop and should_stop()):
        store.index_vectors(index_progress)  # a backend that indexes vectors whole (pgvector's HNSW) does it now
    if cache_max_entries:
        with store.transaction():
            store.prune_cache(cache_max_entries)
    return done, error
