"""One workspace's index as a whole: keep it current, rebuild it atomically, answer queries.

This is the API the CLI and the daemon call; it knows nothing of sockets or terminals.

Writers (sync, rebuild) serialise on the backend's writer lock. A rebuild (fingerprint changed, or
`reindex`) is written somewhere private and swapped in whole (clawmem_index.index.backends: a file copied
in with SQLite's backup API, or a new generation of rows in PostgreSQL): readers see the old index
until the new one is complete, and a rebuild killed at any point leaves the old index untouched;
what it left is removed by the next writer. Before its swap a rebuild takes the vectors the old
index or the embedding cache holds and makes no provider call, so the keyword index never waits for
a provider (a `reindex` or a return to an earlier model keeps every vector); the other vectors
follow, as for a new note.

Searches never wait long for a provider either: a query vector has `search.query_timeout` seconds,
after which the answer is keyword-only and says so.

The write path (clawmem_index.engine.sync, the chunker, batch jobs) is imported by the methods that write,
so that a command that only reads (`search`, `status`, `get`) starts ~14 ms sooner.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import apsw

from clawmem_index import __version__
from clawmem_index.index.backends import backend_for
from clawmem_index.config import MAX_CONTEXT_BUDGET, Settings, check_workspace, workspace_id
from clawmem_index.embeddings.base import KEYWORDS_ONLY, EmbeddingProvider
from clawmem_index.errors import (
    ClawmemError,
    DiskFull,
    IndexUnavailable,
    PathError,
    ProviderError,
    QueryError,
)
from clawmem_index.sources.files import GET_MAX_BYTES, Window, count_lines, read_window
from clawmem_index.search.query_cache import QueryCache
from clawmem_index.search.ranking import SearchOutcome, SearchRequest, run_search
from clawmem_index.index.store import SCHEMA_VERSION, Store
from clawmem_index.text.timefmt import iso_time, seconds
from clawmem_index.sources.paths import open_memory_file
from clawmem_index.sources.workspace import scan, source_scope

if TYPE_CHECKING:
    from clawmem_index.engine.sync import Progress, SyncReport

__all__ = ["MemoryIndex"]

KEYWORD_FORMAT = "porter-unicode61+cjk-1+dates"  # chunks carry their daily file's date
CONTEXT_READ_BYTES = 1 << 20  # at least this much of each range of hit lines is read for `context`
PENDING_CHECK_SECONDS = 0.025  # a query answered without a daemon checks files on disk for this long at most
CACHED_RESULTS = 50  # answers with more results are not kept by the query cache
_UNRESOLVED: Any = object()
_REPORTED_PROBLEMS = 20  # problems `status` lists
_KEPT_PROBLEMS = 1_000  # ... and those kept in meta, so that a pass over some files can keep the others'


@dataclass(frozen=True, slots=True)
class Reporters:
    """Where a write tells how it goes: files synced, chunks given a vector (from the provider or the
    cache), and the vector index's upkeep after them (a cells build)."""

    files: Progress | None = None
    chunks: Progress | None = None
    vectors: Progress | None = None


class MemoryIndex:
    def __init__(self, settings: Settings, *, provider: EmbeddingProvider | None = _UNRESOLVED,
                 lock_timeout: float = 30.0, pending_files: Callable[[], int] | None = None,
                 files_on_disk: Callable[[], int] | None = None, read_only: bool = False,
                 isolate_local_model: bool = False, long_lived: bool = False) -> None:
        """`pending_files` and `files_on_disk` are answered by a watcher without a scan (the daemon's).

        `long_lived`: this process answers many queries (the daemon's): its connections keep
        per-phrase keyword scores, which a one-shot command would read and never reuse.
        `isolate_local_model`: a local model runs in a child process (the daemon's, when
        `embedding.isolate_local` is on), so its memory and any native crash stay out of this one.

        `read_only`: a query client's index (clawmem_index.api): its connections cannot write, and sync and
        reindex are refused, so a reader beside the daemon never becomes a second writer.
        """
        self.settings = settings
        self.read_only = read_only
        self._pending_files = pending_files
        self._files_on_disk = files_on_disk
        self.isolate_local_model = isolate_local_model
        self.long_lived = long_lived
        self.backend = backend_for(settings)
        self.path = settings.index_path
        self.lock_timeout = lock_timeout
        self._provider = provider
        self.provider_note = ""
        self.rebuilt_by = "the next sync rebuilds it"  # what a provider mismatch in `status` leads to
        self.fallback_used = False
        self.rebuilding = False
        """True from the start of a write's rebuild (or switch of model) until it is in place: after an interrupt,
        the index in use is still the one before it (a sync, or embedding, commits each file or batch as done)."""
        self._queries: Any = None
        self._local = threading.local()
        self._stores: list[Store] = []
        self._stores_lock = threading.Lock()
        self._provider_lock = threading.Lock()
        search = settings.search
        self._answers: QueryCache[SearchOutcome] = QueryCache(search.cache_entries, search.cache_seconds)

    # -- provider ---------------------------------------------------------------------------

    @property
    def provider(self) -> EmbeddingProvider | None:
        """The embedding provider, None for keyword search only.

        Raises ProviderUnavailable when a provider named in the settings cannot start (and no
        fallback is set); that is not remembered, so a key set later is picked up.
        """
        if self._provider is _UNRESOLVED:
            with self._provider_lock:
                if self._provider is _UNRESOLVED:
                    self._resolve_provider()
        return self._provider  # type: ignore[no-any-return]

    def _resolve_provider(self) -> None:
        if self.settings.embedding.provider == "none":  # keyword search asked for: no provider code to load
            self._provider, self.provider_note = None, KEYWORDS_ONLY
            return
        try:
            from clawmem_index.embeddings.registry import resolve_provider
        except ImportError:
            self._provider, self.provider_note = None, "embedding providers are not installed: keyword search only"
            return
        resolved = resolve_provider(self.settings.embedding, cache_dir=self.settings.cache_dir,
                                    isolate_local=self.isolate_local_model)
        self._provider = resolved.provider
        self.provider_note = resolved.reason
        self.fallback_used = resolved.fallback_used

    def fingerprint(self) -> dict[str, object]:
        info = self.provider.info if self.provider is not None else None
        chunking = self.settings.chunking
        return {
            "schema": SCHEMA_VERSION,
            "keywords": KEYWORD_FORMAT,
            "provider": info.provider if info else "none",
            "model": info.model if info else "",
            "endpoint": info.endpoint if info else "",
            "dims": info.dims if info else 0,
            "tokenizer": chunking.tokenizer,
            "chunk_tokens": chunking.tokens,
            "chunk_overlap": chunking.overlap,
            **({"precision": precision} if (precision := self.settings.embedding.precision) != "float32" else {}),
        }

    def fingerprint_json(self) -> str:
        """The fingerprint as stored in `meta` (and compared with it)."""
        return json.dumps(self.fingerprint(), sort_keys=True)

    # -- connections ------------------------------------------------------------------------

    def reader(self) -> Store:
        """This thread's connection to the live index (opened on first use; never creates the file)."""
        store: Store | None = getattr(self._local, "store", None)
        if store is None:
            if not self.backend.exists():
                raise IndexUnavailable(f"no index at {self.backend.describe()} yet: run `clawmem index` first")
            store = self.backend.open_reader(read_only=self.read_only, long_lived=self.long_lived)
            self._local.store = store
            with self._stores_lock:
                self._stores.append(store)
        else:
            self.backend.refresh(store)
        return store

    def has_been_built(self) -> bool:
        """Whether a sync ever completed into this index: until one has, a new daemon's queries wait."""
        return self.backend.exists() and self.reader().get_meta("last_sync") is not None

    def close(self) -> None:
        with self._stores_lock:
            for store in self._stores:
                with contextlib.suppress(Exception):
                    store.close()
            self._stores.clear()
        self._local = threading.local()
        self._answers.clear()
        self.release_model()

    @property
    def resolved_provider(self) -> EmbeddingProvider | None:
        """The provider if it has been resolved (None otherwise, or when there is none): never resolves it."""
        return None if self._provider is _UNRESOLVED else self._provider  # type: ignore[no-any-return]

    def release_model(self) -> None:
        """End the model process of an isolated local model (the next embedding would start it again)."""
        provider = self.resolved_provider
        if self.isolate_local_model and hasattr(provider, "close"):
            provider.close()  # type: ignore[union-attr]

    def write_lock(self) -> contextlib.AbstractContextManager[None]:
        """The workspace's writer lock, released if the holder dies (see clawmem_index.index.backends)."""
        return self.backend.write_lock(self.lock_timeout)

    # -- writing ----------------------------------------------------------------------------

    def sync(self, *, progress: Progress | None = None, embed: bool = True,
             embed_progress: Progress | None = None, paths: Iterable[str] | None = None,
             notify: Callable[[str], None] | None = None, vectors_progress: Progress | None = None) -> SyncReport:
        """Bring the index in step with the files, rebuilding first if the fingerprint changed.

        `paths` limits the pass to those index keys (what a watcher saw change), so one edit costs
        the same in a workspace of any size. The report's duration covers the whole run, embedding
        included. `notify` hears about batch jobs as they are submitted and waited for;
        `vectors_progress` about the vector index's upkeep after embedding (a cells build, at 1M
        chunks 30-65 s).
        """
        bars = Reporters(progress, embed_progress, vectors_progress)
        return self._write(lambda fingerprint, store: self._sync_or_rebuild(fingerprint, store, bars, paths), embed,
                           bars, notify)

    def reindex(self, *, progress: Progress | None = None, embed: bool = True,
                embed_progress: Progress | None = None, notify: Callable[[str], None] | None = None,
                vectors_progress: Progress | None = None) -> SyncReport:
        """Rebuild from scratch whatever the fingerprint says (old index serves until the swap)."""
        bars = Reporters(progress, embed_progress, vectors_progress)
        return self._write(lambda fingerprint, store: self._rebuild(fingerprint, bars, store), embed, bars, notify)

    def _write(self, work: Callable[[str, Store | None], SyncReport], embed: bool, bars: Reporters,
               notify: Callable[[str], None] | None = None) -> SyncReport:
        """Run `work` under the writer lock, embed what is pending, and record how it went in `meta`."""
        if self.read_only:
            raise IndexUnavailable(f"the index {self.backend.describe()} is open read-only here: `clawmem index` (or the daemon)"
                                   " updates it")
        check_workspace(self.settings.workspace)
        started = time.perf_counter()
        self.rebuilding = False
        with self.write_lock():
            try:
                fingerprint = self.fingerprint_json()
                report = work(fingerprint, self._open_live())
                store = self._open_live()
                assert store is not None
                try:
                    if embed and self.provider is not None:
                        self._embed(store, self.provider, fingerprint, report, bars, notify)
                    report.duration = time.perf_counter() - started
                    self._record(store, report)
                finally:
                    store.close()
            except apsw.FullError as exc:
                raise self._disk_full(exc) from exc
            except ClawmemError as exc:
                self._record_failure(exc)
                raise
        return report

    def _embed(self, store: Store, provider: EmbeddingProvider, fingerprint: str, report: SyncReport,
               bars: Reporters, notify: Callable[[str], None] | None) -> None:
        """Vectors for what waits: batch jobs for a large backfill (waited for if `batch.wait`), then requests."""
        from clawmem_index.engine.backfill import advance, covered
        from clawmem_index.engine.sync import embed_pending

        batch = self.settings.batch
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
            store, provider, cache_max_entries=self.settings.embedding.cache_max_entries, progress=bars.chunks,
            fingerprint=fingerprint, exclude=covered(store, provider), index_progress=bars.vectors,
            precision=self.settings.embedding.precision)
        report.embedded += embedded

    def _sync_or_rebuild(self, fingerprint: str, store: Store | None, bars: Reporters,
                         paths: Iterable[str] | None) -> SyncReport:
        from clawmem_index.engine.sync import sync_workspace

        # Rows lost behind the writer's back: rebuilt. Checked by a whole pass (a start, `clawmem index`, a
        # rescan), not by each watcher's pass over a few files: it counts the workspace's rows.
        damage = store.damage() if store is not None and paths is None else None
        if damage is None and store is not None and store.get_meta("fingerprint") == fingerprint:
            try:
                return sync_workspace(store, self.settings, progress=bars.files, paths=paths)
            finally:
                store.close()
        if damage is None and store is not None and _same_chunking(store.get_meta("fingerprint"), fingerprint):
            try:
                return self._switch_vectors(fingerprint, store, bars)
            except apsw.Error:
                pass  # rolled back (a schema-1 vector table, say): rebuild from the files instead
        report = self._rebuild(fingerprint, bars, store)
        live = self._open_live()
        assert live is not None
        try:
            follow = sync_workspace(live, self.settings)  # what changed while it was built
        finally:
            live.close()
        report.added += follow.added
        report.updated += follow.updated
        report.removed += follow.removed
        report.errors += [e for e in follow.errors if e not in report.errors]
        report.skipped += [s for s in follow.skipped if s not in report.skipped]
        return report

    @staticmethod
    def _record(store: Store, report: SyncReport) -> None:
        """The run's time and problems in `meta`, for `status`. A pass over some files (a watcher's) keeps
        the problems the last one found with the others: a file skipped as too large stays reported
        after an edit of another, until a pass finds it indexable (or gone)."""
        problems = [*report.errors, *report.skipped]
        count = len(problems)
        if report.scope is not None:
            last = json.loads(store.get_meta("last_sync") or "{}")
            before = list(last.get("problems", []))
            standing = [p for p in before if not any(p.startswith(f"{key}: ") for key in report.scope)]
            problems += standing
            count += int(last.get("problem_count", len(before))) - (len(before) - len(standing))
        store.set_meta("last_sync", json.dumps({
            "at": time.time(), "duration": report.duration, "problems": problems[:_KEPT_PROBLEMS],
            "problem_count": count, "embed_error": report.embed_error}))
        store.delete_meta("last_error")

    def _disk_full(self, exc: apsw.FullError) -> DiskFull:
        """What a full disk under the index says, recorded for `status` where there is room for it."""
        where = self.settings.index_path.parent
        error = DiskFull(f"the disk holding the index ({where}) is full ({exc}): free some space; the next"
                         " `clawmem index`, or the daemon's next pass, goes on from what was committed")
        self._record_failure(error)
        return error

    def _record_failure(self, exc: ClawmemError) -> None:
        """Remember a failed sync in the index, so `status` cannot call the index fresh (best effort)."""
        try:
            store = self._open_live()
        except ClawmemError:
            return  # the index itself is out of reach (a shared index's server): nothing to write it in
        if store is None:
            return
        with contextlib.suppress(Exception):
            store.set_meta("last_error", json.dumps({"at": time.time(), "error": str(exc)}))
        store.close()

    def _open_live(self) -> Store | None:
        """The live index, or None when there is none worth keeping (missing or damaged)."""
        return self.backend.open_live()  # type: ignore[no-any-return]

    def open_writer(self) -> Store | None:
        """A connection that may write the live index (the embedder's), None when there is none."""
        return self._open_live()

    def _switch_vectors(self, fingerprint: str, store: Store, bars: Reporters) -> SyncReport:
        """A new provider or model over the same chunks: new vectors (a parked table, the cache) in place, in one
        transaction.

        Readers see the old index until the commit and the new one after it, never a mix; only
        files changed since the last sync are read. Re-chunking every file and copying the whole
        index (embedding cache included) is most of what a rebuild costs.
        """
        from clawmem_index.engine.sync import embed_pending, sync_workspace

        self.rebuilding = True
        try:
            store.release_vector_index()  # a graph kept would take each new vector one by one
            with store.transaction():
                info = self.provider.info if self.provider is not None else None
                chunks = store.reset_vectors(None if info is None else (info.provider, info.model, info.provider_key),
                                             self.settings.embedding.precision)
                store.set_meta("fingerprint", fingerprint)
                report = sync_workspace(store, self.settings, progress=bars.files)
                taken_back = store.counts()[1] - store.pending_embeddings()  # a parked model's own table
                if self.provider is not None:
                    report.from_cache, _ = embed_pending(store, self.provider, cache_only=True,
                                                         cache_max_entries=0, progress=bars.chunks,
                                                         index_progress=bars.vectors,
                                                         precision=self.settings.embedding.precision)
                report.from_cache += taken_back
            self.rebuilding = False
        finally:
            store.close()
        report.chunks_kept = chunks - report.chunks_removed
        return report

    def _rebuild(self, fingerprint: str, bars: Reporters, replacing: Store | None) -> SyncReport:
        """Build a new index privately (keyword rows, the vectors the old index or the cache has) and swap it in."""
        from clawmem_index.engine.sync import embed_pending, sync_workspace

        if replacing is not None:
            replacing.close()
        started = time.perf_counter()
        self.rebuilding = True
        with self.backend.fresh() as fresh:
            fresh.set_meta("fingerprint", fingerprint)
            report = sync_workspace(fresh, self.settings, progress=bars.files, bulk=True)
            provider = self.provider
            info = None if provider is None else provider.info
            precision = self.settings.embedding.precision
            report.from_cache = fresh.carry_vectors(
                None if info is None else (info.provider, info.model, info.provider_key), precision,
                progress=bars.chunks, index_progress=bars.vectors)
            if provider is not None:
                cached, _ = embed_pending(fresh, provider, cache_only=True, cache_max_entries=0,
                                          progress=bars.chunks, index_progress=bars.vectors, precision=precision)
                report.from_cache += cached
            self.backend.swap_in(fresh)
        self.rebuilding = False
        report.duration = time.perf_counter() - started
        return report

    # -- reading ----------------------------------------------------------------------------

    def search(self, request: SearchRequest) -> dict[str, object]:
        store = self.reader()
        unseen = self._scope(store, request)
        mode = request.mode or self.settings.search.mode
        provider, note = self._query_provider(store) if mode != "bm25" else (None, None)
        key = (store, store.data_version(), request, self.settings.search, provider is None)
        outcome = self._answers.get(key)
        pending = self._start_pending_check(store) if outcome is None else None
        if outcome is None:
            outcome = run_search(store, provider, request, self.settings.search)
            # Not kept: an answer a failing provider degraded (it may answer the next time), nor a
            # large one (the cache's memory stays ~256 x 50 snippets, whatever clients ask for).
            if outcome.degraded is None and len(outcome.results) <= CACHED_RESULTS:
                self._answers.put(key, outcome)
        # Whose vectors the index holds (a keyword-only answer from an index with vectors says so too).
        built = json.loads(store.get_meta("fingerprint") or "{}")
        answer: dict[str, object] = {
            "results": [r.as_dict() for r in outcome.results],
            "provider": built.get("provider", "none"),
            "model": built.get("model", ""),
            "mode": outcome.mode,
            "index": {**(pending() if pending is not None else self._query_pending_files(store)),
                      "pending_embeddings": store.pending_embeddings() if _has_vectors(store) else 0},
        }
        if self.fallback_used:
            answer["fallback"] = True
            answer["fallback_reason"] = self.provider_note
        if note or outcome.degraded:
            answer["warning"] = note or outcome.degraded
        if unseen:
            answer["unreadable_workspaces"] = unseen
        return answer

    def _scope(self, store: Store, request: SearchRequest) -> list[str]:
        """Point a shared index's reader at the workspaces asked for; those it cannot see (absent or not granted)."""
        own = self.settings.workspace_id
        asked = tuple(dict.fromkeys(workspace_id(name) for name in request.workspaces or ()))
        if self.backend.name != "postgres":
            if asked and asked != (own,):
                raise QueryError("only a shared index (index_backend = \"postgres\") searches other workspaces")
            return []
        if any(not name for name in asked):
            raise QueryError("'workspaces' holds a name without a letter or digit")
        store.scope = asked or (own,)
        store.data_version()
        return [name for name in store.scope if name not in store.visible()]

    def _query_provider(self, store: Store) -> tuple[EmbeddingProvider | None, str | None]:
        """The provider for query vectors, with a deadline, only if it made the index's vectors.

        Vectors of other models do not compare; a provider that cannot start leaves keyword search.
        """
        built = json.loads(store.get_meta("fingerprint") or "{}")
        try:
            provider = self.provider
        except ProviderError as exc:
            return None, f"{exc}: keyword results only"
        if provider is None:
            note = self.provider_note or "no embedding provider available"
            return None, note if "keyword search only" in note else f"{note}: keyword results only"
        if built.get("provider", "none") == "none":
            return None, "the index has no vectors yet (the next sync adds them): keyword results only"
        info = provider.info
        if (info.provider, info.model, info.endpoint, info.dims) != (
                built.get("provider"), built.get("model"), built.get("endpoint", info.endpoint), built.get("dims")):
            current = {"provider": info.provider, "model": info.model, "endpoint": info.endpoint, "dims": info.dims}
            return None, f"{_built_otherwise(built, current)}: keyword results only until the next sync rebuilds it"
        if self._queries is None:
            from clawmem_index.embeddings.deadline import QueryDeadline

            self._queries = QueryDeadline(provider, self.settings.search.query_timeout,
                                          first_use=self.settings.search.first_query_timeout)
        return self._queries, None

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        """Lines of one memory file, read from a descriptor opened beneath the workspace (see clawmem_index.sources.files).

        The text is at most `max_bytes` (GET_MAX_BYTES by default) of whole lines, streamed, so a
        huge file costs only what is returned; a cut answer says `truncated` and where to go on.
        """
        for name, value, what in (("from", start, "a line number"), ("lines", lines, "a count"),
                                  ("max_bytes", max_bytes, "a byte count")):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise QueryError(f"'{name}' must be {what} >= 1")
        first = start or 1
        with self._open(path) as opened:
            key, window = opened.path, read_window(opened.fd, first, lines,
                                                   GET_MAX_BYTES if max_bytes is None else max_bytes)
            past_end = count_lines(opened.fd) if first > 1 and not window.lines else None
        answer: dict[str, object] = {"path": key, "text": window.text, "from": first, "lines": window.lines,
                                     "truncated": window.truncated}
        if window.next_from is not None:
            answer["next_from"] = window.next_from
        if past_end is not None:  # nothing from `from` on: how many lines the file has
            answer["file_lines"] = past_end
        return answer

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, object]:
        """The search's best lines as one prompt block of at most `budget` tokens (clawmem_index.search.context).

        Lines are read from the memory files as they are now, through the same checks as `get`; a
        hit whose file is gone or refused since the last sync is left out. Transcript hits are left
        out too (their lines are JSON): the block is made of memory files. On a shared index,
        `workspaces` may name others: their files are on other hosts, so their lines are the chunk
        text the index holds (as their last sync saw them), and their sections name their workspace.
        """
        from clawmem_index.search.context import Hit, build_context
        from clawmem_index.text.tokens import MAX_TOKEN_BYTES, count_tokens

        budget = self.settings.search.context_budget if budget is None else budget
        if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= MAX_CONTEXT_BUDGET:
            raise QueryError(f"'budget' must be between 0 and {MAX_CONTEXT_BUDGET} tokens")
        if request.source not in (None, "memory"):
            raise QueryError("the context block is made of memory files: leave 'source' out")
        answer = self.search(replace(request, source="memory"))  # another workspace on SQLite: a QueryError
        results: list[dict[str, Any]] = answer.pop("results")  # type: ignore[assignment]
        own = self.settings.workspace_id
        hits = [Hit(r["path"], r["start_line"], r["end_line"], r["score"],
                    None if r.get("workspace", own) == own else r["workspace"]) for r in results]
        tokenizer = self.settings.chunking.tokenizer
        # Hits are a few KiB of lines each; only a line longer than any that fits (text of n bytes is at
        # least n / MAX_TOKEN_BYTES tokens) may be cut short by the read, and is then left out.
        room = max((budget + 1) * MAX_TOKEN_BYTES, CONTEXT_READ_BYTES)
        store = self.reader() if any(hit.workspace is not None for hit in hits) else None  # the search's connection

        def read(workspace: str | None, path: str, first: int, last: int) -> list[str | None]:
            if workspace is None or store is None:
                return self._context_lines(path, first, last, room)
            return _within(store.chunk_lines(workspace, path, first, last), room)

        block = build_context(hits, read, lambda text: count_tokens(text, tokenizer), budget)
        return {**block.as_dict(), "tokenizer": tokenizer, **answer}

    def _context_lines(self, path: str, first: int, last: int, max_bytes: int) -> list[str | None]:
        """Lines first..last of a memory file for `context`: None for one cut short, none if the file cannot be read."""
        try:
            _, window = self._read_window(path, first, last - first + 1, max_bytes)
        except PathError:
            return []
        lines: list[str | None] = [line.removesuffix("\r") for line in window.text.split("\n")] if window.lines else []
        if window.cut:
            lines[-1] = None
        return lines

    def _read_window(self, path: str, first: int, count: int | None, max_bytes: int) -> tuple[str, Window]:
        """(the file's index key, its lines) through a descriptor opened beneath the workspace."""
        with self._open(path) as opened:
            return opened.path, read_window(opened.fd, first, count, max_bytes)

    def _open(self, path: str) -> Any:
        """A memory file opened beneath the workspace, with every rule `get` applies (see clawmem_index.sources.files)."""
        return open_memory_file(self.settings.workspace, path, self.settings.extra_paths,
                                refuse_hardlinks=self.settings.refuse_hardlinks, exclude=self.settings.exclude)

    def pending_files(self, store: Store) -> int:
        """Files added, changed or deleted on disk since the last sync (stat only, nothing read)."""
        if self._pending_files is not None:
            return self._pending_files()
        return self.disk_state(store)[1]

    def _start_pending_check(self, store: Store) -> Callable[[], dict[str, object]] | None:
        """The pending-files check of a search, started beside it on a thread of its own (None: not so).

        Without a watcher a query checks files for up to PENDING_CHECK_SECONDS, which was a fifth of a
        CLI search at 20,000 notes and more; while FTS5 ranks common words (C code that lets go of the
        interpreter) the check's stats and look-ups run on the other core instead of after it. The
        thread reads through a connection of its own to the SQLite file, closed when it is done; a
        shared (PostgreSQL) index reads its file rows in one round trip anyway, and a watcher knows the
        count: both answer in the caller's thread. The returned function waits for the count and
        raises what the check raised.
        """
        if self._pending_files is not None or self.backend.name == "postgres":
            return None
        found: list[dict[str, object]] = []
        failed: list[BaseException] = []

        def check() -> None:
            try:
                own = self.backend.open_reader(read_only=self.read_only, long_lived=False)
                try:
                    found.append(self._query_pending_files(own))
                finally:
                    own.close()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                failed.append(exc)

        worker = threading.Thread(target=check, name="clawmem-pending-check", daemon=True)
        worker.start()

        def result() -> dict[str, object]:
            worker.join()
            if failed:
                raise failed[0]
            return found[0]

        return result

    def _query_pending_files(self, store: Store) -> dict[str, object]:
        """`pending_files` for a query's answer, at a cost that does not grow with the workspace.

        A watcher (the daemon's) knows it exactly. Without one, files are checked against the index
        for at most PENDING_CHECK_SECONDS: a workspace checked whole gets its exact count, a bigger one
        the changes found so far (a lower bound) and `pending_files_complete: false`. The newest daily
        logs are checked first (`scan(newest_first=True)`): those are the files being written. `status`
        always counts them all.
        """
        if self._pending_files is not None:
            return {"pending_files": self._pending_files()}
        deadline = time.monotonic() + PENDING_CHECK_SECONDS
        memory, sessions = source_scope(self.settings)
        pending = present = 0
        # A file's row is a lookup in SQLite, a round trip to a shared index: that one is read whole, once.
        stat_of = store.file_stats().get if self.backend.name == "postgres" else store.file_stat
        for f in scan(self.settings.workspace, self.settings.extra_paths, **self._scan_rules(),
                      memory=memory, sessions=sessions, newest_first=True):
            row = stat_of(f.path)
            if row != (f.mtime_ns, f.size):
                pending += 1
            present += row is not None
            if time.monotonic() > deadline:
                return {"pending_files": pending, "pending_files_complete": False}
        return {"pending_files": pending + store.counts()[0] - present}

    def _scan_rules(self) -> dict[str, Any]:
        """What a scan leaves out, as a sync's does: a file a sync skips is never pending."""
        return {"exclude": self.settings.exclude, "max_bytes": self.settings.max_file_bytes,
                "refuse_hardlinks": self.settings.refuse_hardlinks}

    def disk_state(self, store: Store | None) -> tuple[int, int]:
        """(files of the configured sources on disk, files changed since the last sync), by one stat scan."""
        indexed = store.file_stats() if store is not None else {}
        on_disk = pending = present = 0
        memory, sessions = source_scope(self.settings)
        for f in scan(self.settings.workspace, self.settings.extra_paths, **self._scan_rules(),
                      memory=memory, sessions=sessions):
            on_disk += 1
            row = indexed.get(f.path)
            if row != (f.mtime_ns, f.size):
                pending += 1
            if row is not None:
                present += 1
        return on_disk, pending + len(indexed) - present

    def status(self, *, last_error: str | None = None) -> dict[str, object]:
        """What is indexed, with which model, how fresh it is, and every reason it is not.

        `fresh` is true only when nothing waits (files, vectors), the configured provider is the
        one the index was built with, and the last sync succeeded; `stale_reasons` says why not.
        `last_error` is the daemon's last failed run (in-process, the index's own record).
        """
        data: dict[str, object] = {
            "version": __version__,
            "workspace": str(self.settings.workspace),
            **self.backend.status(),
            "socket": str(self.settings.socket_path),
        }
        try:
            exists = self.backend.exists()
        except IndexUnavailable as exc:  # a shared index's server is down or refuses us: say so, never "fresh"
            data.update(index_exists=None, fresh=False, stale_reasons=[str(exc)])
            return data
        data["index_exists"] = exists
        reasons: list[str] = []
        if not exists:
            on_disk = self._files_on_disk() if self._files_on_disk else self.disk_state(None)[0]
            data.update(files_on_disk=on_disk, files_indexed=0, chunks_indexed=0, fresh=False,
                        configured_provider=self._provider_state({})[0],
                        stale_reasons=["no index yet: run `clawmem index` (or start `clawmem serve`)"])
            return data
        try:  # a shared index's server that stalls (a lock, overload) is answered as a dead one is
            store = self.reader()
            files, chunks = store.counts()
            meta = store.all_meta()
            if self._pending_files is not None:
                pending_files = self._pending_files()
                on_disk = self._files_on_disk() if self._files_on_disk else files
            else:
                on_disk, pending_files = self.disk_state(store)
            pending_embeddings = store.pending_embeddings() if _has_vectors(store) else 0
            damage, batch_jobs, vector_search = store.damage(chunks), store.job_count(), store.vector_method()
        except IndexUnavailable as exc:
            data.update(fresh=False, stale_reasons=[str(exc)])
            return data
        fingerprint = json.loads(meta.get("fingerprint", "{}"))
        last = json.loads(meta.get("last_sync", "null") or "null") or {}
        failure = json.loads(meta.get("last_error", "null") or "null") or {}
        last_error = last_error or failure.get("error")
        provider, mismatch = self._provider_state(fingerprint)
        if damage:
            reasons.append(f"{damage}: the next sync rebuilds it")
        if on_disk == 0:
            reasons.append("no memory files in the workspace (MEMORY.md or memory/**/*.md): is it the right folder?")
        if pending_files:
            reasons.append(f"{pending_files} file{'s' if pending_files != 1 else ''} changed since the last sync")
        if pending_embeddings:
            reasons.append(f"{pending_embeddings} chunk{'s' if pending_embeddings != 1 else ''} wait for a vector")
        if mismatch:
            reasons.append(mismatch)
        if last_error:
            reasons.append(f"the last sync failed: {last_error}")
        data.update(
            files_on_disk=on_disk,
            files_indexed=files,
            chunks_indexed=chunks,
            fingerprint=fingerprint,
            provider=fingerprint.get("provider", "none"),
            model=fingerprint.get("model", ""),
            dims=int(meta.get("vector_dims") or fingerprint.get("dims", 0) or 0),
            configured_provider=provider,
            sqlite_vec_loaded=store.vec_loaded,
            vector_search=vector_search,
            pending_files=pending_files,
            pending_embeddings=pending_embeddings,
            batch_jobs=batch_jobs,
            last_sync_at=iso_time(last.get("at")),
            last_sync_duration=seconds(last.get("duration")),
            last_sync_problem_count=int(last.get("problem_count", 0)),
            last_sync_problems=last.get("problems", [])[:_REPORTED_PROBLEMS],
            last_error=last_error,
            fresh=not reasons,
            stale_reasons=reasons,
            schema_version=int(meta.get("schema_version", "0")),
        )
        if self.provider_note:
            data["provider_note"] = self.provider_note
        return data

    def _provider_state(self, built: dict[str, Any]) -> tuple[str, str | None]:
        """The configured provider/model, and why it differs from the index's (None when it does not)."""
        try:
            provider = self.provider
        except ProviderError as exc:
            return "unavailable", str(exc)
        if provider is None:
            current = {"provider": "none", "model": "", "endpoint": "", "dims": 0}
        else:
            info = provider.info
            current = {"provider": info.provider, "model": info.model, "endpoint": info.endpoint, "dims": info.dims}
        name = f"{current['provider']}/{current['model']}" if current["model"] else str(current["provider"])
        if any(built.get(k) != v for k, v in current.items()):
            return name, f"{_built_otherwise(built, current)}: {self.rebuilt_by}"
        return name, None


def _built_otherwise(built: dict[str, Any], current: dict[str, Any]) -> str:
    """How the index's fingerprint differs from the configured provider's identity (provider, model,
    endpoint, dims): a model's name alone would read "built with X, not X" when only its file, its
    window or its server changed."""
    def label(provider: object, model: object) -> str:
        return f"{provider}/{model}" if model else str(provider)

    was, now = label(built.get("provider", "none"), built.get("model")), label(current["provider"], current["model"])
    if was != now:
        return f"the index was built with {was}, not the configured {now}"
    changed = [label for label, key in (("endpoint", "endpoint"), ("vector size", "dims"))
               if built.get(key) != current[key]]
    return (f"the index was built with {was} under other settings (its {' and '.join(changed) or 'identity'}"
            f" differs: another model file, window, server or size)")


def _within(lines: list[str | None], max_bytes: int) -> list[str | None]:
    """Another workspace's lines for `context` as `_context_lines` reads a file's: a line's final CR dropped,
    and the line that goes past `max_bytes` None (too long to show whole), nothing after it."""
    out: list[str | None] = []
    used = 0
    for line in lines:
        if line is not None:
            used += len(line.encode()) + 1
            if used > max_bytes:
                out.append(None)
                break
            line = line.removesuffix("\r")
        out.append(line)
    return out


def _has_vectors(store: Store) -> bool:
    return '"provider": "none"' not in (store.get_meta("fingerprint") or '"provider": "none"')


_CHUNKING_KEYS = ("schema", "keywords", "tokenizer", "chunk_tokens", "chunk_overlap")


def _same_chunking(old: str | None, new: str) -> bool:
    """Whether two fingerprints chunk and tokenize files identically (their providers may differ)."""
    try:
        before, after = json.loads(old or "{}"), json.loads(new)
    except ValueError:
        return False
    return all(k in before and before[k] == after.get(k) for k in _CHUNKING_KEYS)
