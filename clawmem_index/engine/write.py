"""Write one index under the writer lock: a sync in place, a switch of vectors, or a rebuild swapped in whole.

Writers (sync, rebuild) serialise on the backend's writer lock. A rebuild (fingerprint changed, or
`reindex`) is written somewhere private and swapped in whole (clawmem_index.index.backends: a file copied
in with SQLite's backup API, or a new generation of rows in PostgreSQL): readers see the old index
until the new one is complete, and a rebuild killed at any point leaves the old index untouched;
what it left is removed by the next writer. Before its swap a rebuild takes the vectors the old
index or the embedding cache holds and makes no provider call, so the keyword index never waits for
a provider (a `reindex` or a return to an earlier model keeps every vector); the other vectors
follow, as for a new note.

`MemoryIndex.sync` and `reindex` import this module when they write, so that a command that only
reads does not load the write path.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from clawmem_index.config import Settings, check_workspace
from clawmem_index.embeddings.base import EmbeddingProvider
from clawmem_index.engine.backfill import advance, covered
from clawmem_index.engine.embed import embed_pending
from clawmem_index.engine.status import record_failure, record_sync
from clawmem_index.engine.sync import Progress, SyncReport, sync_workspace
from clawmem_index.errors import ClawmemError, IndexUnavailable, StoreError
from clawmem_index.index.backends import SqliteBackend
from clawmem_index.index.interface import IndexStore

if TYPE_CHECKING:
    from clawmem_index.index.backends import Backend

__all__ = ["Reporters", "Work", "Writable", "rebuild", "sync_or_rebuild", "write"]


class Writable(Protocol):
    """What a write needs of its index (`MemoryIndex` is one): where and how it is kept, its writer lock and
    connection, and the provider and fingerprint the write embeds and records with."""

    settings: Settings
    backend: Backend[Any]
    read_only: bool
    rebuilding: bool  # set while a rebuild or a switch of vectors runs (`status` says so)

    @property
    def provider(self) -> EmbeddingProvider | None: ...

    @property
    def precision(self) -> str: ...

    def fingerprint_json(self) -> str: ...

    def write_lock(self) -> contextlib.AbstractContextManager[None]: ...

    def open_writer(self) -> IndexStore | None: ...


@dataclass(frozen=True, slots=True)
class Reporters:
    """Where a write tells how it goes: files synced, chunks given a vector (from the provider or the
    cache), and the vector index's upkeep after them (a cells build)."""

    files: Progress | None = None
    chunks: Progress | None = None
    vectors: Progress | None = None


# A write's work: given the fingerprint and the live index's connection (None: no usable index), what it did, and
# the connection to go on with: the same one, or after a rebuild swapped a new index in, one to the new index
# (None: open one). The connection given is the work's to close only when it returns another.
Work = Callable[[str, IndexStore | None], tuple[SyncReport, IndexStore | None]]


def write(index: Writable, work: Work, embed: bool, bars: Reporters,
          notify: Callable[[str], None] | None = None) -> SyncReport:
    """Run `work` under the writer lock, embed what is pending, and record how it went in `meta`: on one
    connection, opened here and closed here, unless a rebuild replaced the index it was opened on."""
    if index.read_only:
        raise IndexUnavailable(f"the index {index.backend.describe()} is open read-only here: `clawmem index`"
                               " (or the daemon) updates it")
    check_workspace(index.settings.workspace)
    started = time.perf_counter()
    index.rebuilding = False
    with index.write_lock():
        try:
            with index.backend.writing():
                report = _write(index, work, embed, bars, notify, started)
        except ClawmemError as exc:
            record_failure(index.backend, exc)
            raise
    return report


def _write(index: Writable, work: Work, embed: bool, bars: Reporters, notify: Callable[[str], None] | None,
           started: float) -> SyncReport:
    """`write`'s work and embedding, under its lock, on its one connection."""
    fingerprint = index.fingerprint_json()
    given = index.open_writer()
    store: IndexStore | None = given
    try:
        report, store = work(fingerprint, given)
        if store is None:
            store = index.open_writer()
        assert store is not None
        if embed and index.provider is not None:
            _embed(index, store, index.provider, fingerprint, report, bars, notify)
        report.duration = time.perf_counter() - started
        record_sync(store, report)
    finally:
        if store is not None:
            store.close()
        if given is not None and given is not store:
            given.close()  # a work that failed, or a rebuild's (closed already: closing twice is harmless)
    return report


def _embed(index: Writable, store: IndexStore, provider: EmbeddingProvider, fingerprint: str, report: SyncReport,
           bars: Reporters, notify: Callable[[str], None] | None) -> None:
    """Vectors for what waits: batch jobs for a large backfill (waited for if `batch.wait`), then requests."""
    batch = index.settings.batch
    jobs = advance(store, provider, batch)
    if jobs.submitted and notify:
        notify(f"submitted {jobs.submitted} batch job(s) for {jobs.waiting_chunks} chunks")
    while jobs.busy and batch.wait:
        if notify:
            notify(f"waiting for {jobs.running} batch job(s) ({jobs.waiting_chunks} chunks)")
        time.sleep(batch.poll_interval)  # the provider works through the job: nothing to do meanwhile
        jobs = advance(store, provider, batch)
    report.batch_notes += jobs.failed
    report.batch_jobs, report.batch_chunks = jobs.running, jobs.waiting_chunks
    embedded, report.embed_error = embed_pending(
        store, provider, cache_max_entries=index.settings.embedding.cache_max_entries, progress=bars.chunks,
        fingerprint=fingerprint, exclude=covered(store, provider), index_progress=bars.vectors,
        precision=index.precision)
    report.embedded += embedded


def sync_or_rebuild(index: Writable, fingerprint: str, store: IndexStore | None, bars: Reporters,
                    paths: Iterable[str] | None) -> tuple[SyncReport, IndexStore | None]:
    """A sync in place when the fingerprint is the index's; a switch of vectors when only the provider changed;
    else (a precision change too) a rebuild, followed by a sync of what changed while it was built (a `Work`)."""
    # Rows lost behind the writer's back: rebuilt. Checked by a whole pass (a start, `clawmem index`, a
    # rescan), not by each watcher's pass over a few files: it counts the workspace's rows.
    damage = store.damage() if store is not None and paths is None else None
    if store is None and isinstance(index.backend, SqliteBackend) and not index.backend.exists():
        return _first_index(index, index.backend, fingerprint, bars)
    if damage is None and store is not None and store.meta.get("fingerprint") == fingerprint:
        return sync_workspace(store, index.settings, progress=bars.files, paths=paths), store
    if damage is None and store is not None and _same_chunking(store.meta.get("fingerprint"), fingerprint) \
            and not _only_precision_differs(store.meta.get("fingerprint"), fingerprint):
        try:
            return _switch_vectors(index, fingerprint, store, bars), store
        except StoreError:
            pass  # rolled back (a schema-1 vector table, say): rebuild from the files instead
    report = rebuild(index, fingerprint, bars, store)
    live = index.open_writer()
    assert live is not None
    try:
        follow = sync_workspace(live, index.settings)  # what changed while it was built
    except BaseException:
        live.close()
        raise
    report.added += follow.added
    report.updated += follow.updated
    report.removed += follow.removed
    report.errors += [e for e in follow.errors if e not in report.errors]
    report.skipped += [s for s in follow.skipped if s not in report.skipped]
    return report, live


def _first_index(index: Writable, backend: SqliteBackend, fingerprint: str,
                 bars: Reporters) -> tuple[SyncReport, IndexStore]:
    """A workspace's first index file, written where it is searched: there is no older one to keep serving,
    and readers answer from the files indexed so far (the curated memory and the latest days first), saying
    what is not in yet, instead of waiting for the whole pass. Killed part-way, the next pass goes on from
    there. (A shared index's new workspace is built as a generation and switched to: its planner statistics
    are taken before readers see it.)"""
    live = backend.create_live()
    try:
        live.meta.set("fingerprint", fingerprint)
        return sync_workspace(live, index.settings, progress=bars.files, growing=True), live
    except BaseException:
        live.close()
        raise


def _switch_vectors(index: Writable, fingerprint: str, store: IndexStore, bars: Reporters) -> SyncReport:
    """A new provider or model over the same chunks: new vectors (a parked table, the cache) in place, in one
    transaction.

    Readers see the old index until the commit and the new one after it, never a mix; only
    files changed since the last sync are read. Re-chunking every file and copying the whole
    index (embedding cache included) is most of what a rebuild costs.
    """
    index.rebuilding = True
    try:
        store.vectors.release_index()  # a graph kept would take each new vector one by one
        with store.transaction():
            info = index.provider.info if index.provider is not None else None
            owner = None if info is None else (info.provider, info.model, info.provider_key)
            chunks = store.embeddings.reset_vectors(owner, index.precision)
            store.meta.set("fingerprint", fingerprint)
            report = sync_workspace(store, index.settings, progress=bars.files)
            taken_back = store.counts()[1] - store.pending_embeddings()  # a parked model's own table
            if index.provider is not None:
                report.from_cache, _ = embed_pending(store, index.provider, cache_only=True,
                                                     cache_max_entries=0, progress=bars.chunks,
                                                     index_progress=bars.vectors,
                                                     precision=index.precision)
            report.from_cache += taken_back
    finally:
        index.rebuilding = False
    report.chunks_kept = chunks - report.chunks_removed
    return report


def rebuild(index: Writable, fingerprint: str, bars: Reporters, replacing: IndexStore | None) -> SyncReport:
    """Build a new index privately (keyword rows, the vectors the old index or the cache has) and swap it in
    (`replacing`, a connection to the old index, is closed first: the caller opens one to the new)."""
    if replacing is not None:
        replacing.close()
    started = time.perf_counter()
    index.rebuilding = True
    with index.backend.fresh() as fresh:
        fresh.meta.set("fingerprint", fingerprint)
        report = sync_workspace(fresh, index.settings, progress=bars.files, bulk=True)
        provider = index.provider
        info = None if provider is None else provider.info
        precision = index.precision
        report.from_cache = fresh.carry.carry_vectors(
            None if info is None else (info.provider, info.model, info.provider_key), precision,
            progress=bars.chunks, index_progress=bars.vectors)
        if provider is not None:
            cached, _ = embed_pending(fresh, provider, cache_only=True, cache_max_entries=0,
                                      progress=bars.chunks, index_progress=bars.vectors, precision=precision)
            report.from_cache += cached
        index.backend.swap_in(fresh)
    index.rebuilding = False
    report.duration = time.perf_counter() - started
    return report


_CHUNKING_KEYS = ("schema", "keywords", "tokenizer", "chunk_tokens", "chunk_overlap")


def _parsed(old: str | None, new: str) -> tuple[dict[str, object], dict[str, object]] | None:
    try:
        return json.loads(old or "{}"), json.loads(new)
    except ValueError:
        return None


def _only_precision_differs(old: str | None, new: str) -> bool:
    """Whether the same vectors are to be stored at another precision: a rebuild takes them over converted, into
    a file without the old table's pages (a switch in place would leave them free, the file as large as before)."""
    if (both := _parsed(old, new)) is None:
        return False
    before, after = ({k: v for k, v in side.items() if k != "precision"} for side in both)
    return both[0].get("precision", "float32") != both[1].get("precision", "float32") and before == after


def _same_chunking(old: str | None, new: str) -> bool:
    """Whether two fingerprints chunk and tokenize files identically (their providers may differ)."""
    if (both := _parsed(old, new)) is None:
        return False
    before, after = both
    return all(k in before and before[k] == after.get(k) for k in _CHUNKING_KEYS)
