"""How fresh the index is: the files changed on disk since the last sync, `status`, and what each write records for it.

A write records in `meta` when it ran and the problems it found (`last_sync`), or why it failed (`last_error`);
`status` reads that back beside the files pending on disk, counted by a watcher (the daemon's) or by a stat scan.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from clawmem_index import __version__
from clawmem_index.config import Settings
from clawmem_index.engine.embed import EMBEDDING_ERROR
from clawmem_index.errors import ClawmemError, IndexUnavailable, ProviderError
from clawmem_index.index.interface import IndexStore
from clawmem_index.sources.workspace import scan, source_scope
from clawmem_index.text.timefmt import iso_time, seconds

if TYPE_CHECKING:
    from clawmem_index.embeddings.base import EmbeddingProvider
    from clawmem_index.engine.sync import SyncReport
    from clawmem_index.index.backends import Backend

__all__ = ["Freshness", "Observed", "built_otherwise", "has_vectors", "record_failure", "record_sync", "status"]

PENDING_CHECK_SECONDS = 0.025  # a query answered without a daemon checks files on disk for this long at most
_REPORTED_PROBLEMS = 20  # problems `status` lists
_KEPT_PROBLEMS = 1_000  # ... and those kept in meta, so that a pass over some files can keep the others'


class Observed(Protocol):
    """What `status` reads of an index (`MemoryIndex` is one): its settings, where it is, how fresh its files are,
    and the provider it answers with."""

    settings: Settings
    backend: Backend[Any]
    freshness: Freshness
    provider_note: str  # why the provider is what it is ("" when as configured)
    rebuilt_by: str  # what a provider mismatch leads to

    @property
    def provider(self) -> EmbeddingProvider | None: ...

    def reader(self) -> IndexStore: ...


class Freshness:
    """The files added, changed or deleted on disk since the last sync: told by a watcher, or found by a stat scan."""

    def __init__(self, settings: Settings, backend: Backend[Any], *, read_only: bool,
                 pending_files: Callable[[], int] | None, files_on_disk: Callable[[], int] | None) -> None:
        """`pending_files` and `files_on_disk` are answered by a watcher without a scan (the daemon's)."""
        self.settings = settings
        self.backend = backend
        self.read_only = read_only
        self.watched_pending = pending_files
        self.watched_on_disk = files_on_disk

    def pending_files(self, store: IndexStore) -> int:
        """Files added, changed or deleted on disk since the last sync (stat only, nothing read)."""
        if self.watched_pending is not None:
            return self.watched_pending()
        return self.disk_state(store)[1]

    def start_query_check(self, store: IndexStore) -> Callable[[], dict[str, object]] | None:
        """The pending-files check of a search, started beside it on a thread of its own (None: not so).

        Without a watcher a query checks files for up to PENDING_CHECK_SECONDS, which was a fifth of a
        CLI search at 20,000 notes and more; while FTS5 ranks common words (C code that lets go of the
        interpreter) the check's stats and look-ups run on the other core instead of after it. The
        thread reads through a connection of its own to the SQLite file, closed when it is done; a
        shared (PostgreSQL) index reads its file rows in one round trip anyway, and a watcher knows the
        count: both answer in the caller's thread. The returned function waits for the count and
        raises what the check raised.
        """
        if self.watched_pending is not None or self.backend.name == "postgres":
            return None
        found: list[dict[str, object]] = []
        failed: list[BaseException] = []

        def check() -> None:
            try:
                own = self.backend.open_reader(read_only=self.read_only, long_lived=False)
                try:
                    found.append(self.query_pending_files(own))
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

    def query_pending_files(self, store: IndexStore) -> dict[str, object]:
        """`pending_files` for a query's answer, at a cost that does not grow with the workspace.

        A watcher (the daemon's) knows it exactly. Without one, files are checked against the index
        for at most PENDING_CHECK_SECONDS: a workspace checked whole gets its exact count, a bigger one
        the changes found so far (a lower bound) and `pending_files_complete: false`. The newest daily
        logs are checked first (`scan(newest_first=True)`): those are the files being written. `status`
        always counts them all.
        """
        if self.watched_pending is not None:
            return {"pending_files": self.watched_pending()}
        memory, sessions = source_scope(self.settings)
        held = self.backend.files_held_by(store)
        if held is not None and not self.holds_memory_files():
            # a reader elsewhere: the files are the writer's, none here to compare (0 is a lower bound)
            return {"pending_files": 0, "pending_files_complete": False, "files_held_by": held}
        deadline = time.monotonic() + PENDING_CHECK_SECONDS
        pending = present = 0
        # A file's row is a lookup in SQLite, a round trip to a shared index: that one is read whole, once.
        stat_of = store.file_stats().get if self.backend.name == "postgres" else store.file_stat
        checked = 0
        for f in scan(self.settings.workspace, self.settings.extra_paths, **self._scan_rules(),
                      memory=memory, sessions=sessions, newest_first=True):
            # Past the deadline only with a file still unchecked: a scan that reached its end is exact,
            # however long it took (a loaded machine), and the first file is always checked.
            if checked and time.monotonic() > deadline:
                return {"pending_files": pending, "pending_files_complete": False}
            row = stat_of(f.path)
            if row != (f.mtime_ns, f.size):
                pending += 1
            present += row is not None
            checked += 1
        return {"pending_files": pending + store.counts()[0] - present}

    def holds_memory_files(self) -> bool:
        """Whether this folder has a memory file at all (the scan stops at the first)."""
        memory, sessions = source_scope(self.settings)
        found = scan(self.settings.workspace, self.settings.extra_paths, **self._scan_rules(), memory=memory,
                     sessions=sessions, newest_first=True)
        return next(iter(found), None) is not None

    def _scan_rules(self) -> dict[str, Any]:
        """What a scan leaves out, as a sync's does: a file a sync skips is never pending."""
        return {"exclude": self.settings.excluded, "max_bytes": self.settings.max_file_bytes,
                "refuse_hardlinks": self.settings.refuse_hardlinks}

    def disk_state(self, store: IndexStore | None) -> tuple[int, int]:
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


def status(index: Observed, *, last_error: str | None = None) -> dict[str, object]:  # noqa: C901
    """What is indexed, with which model, how fresh it is, and every reason it is not.

    `fresh` is true only when nothing waits (files, vectors), the configured provider is the
    one the index was built with, and the last sync succeeded; `stale_reasons` says why not.
    `last_error` is the daemon's last failed run (in-process, the index's own record).
    """
    freshness = index.freshness
    data: dict[str, object] = {
        "version": __version__,
        "workspace": str(index.settings.workspace),
        **index.backend.status(),
        "socket": str(index.settings.socket_path),
    }
    try:
        exists = index.backend.exists()
    except IndexUnavailable as exc:  # a shared index's server is down or refuses us: say so, never "fresh"
        data.update(index_exists=None, fresh=False, stale_reasons=[str(exc)])
        return data
    data["index_exists"] = exists
    reasons: list[str] = []
    if not exists:
        on_disk = freshness.watched_on_disk() if freshness.watched_on_disk else freshness.disk_state(None)[0]
        data.update(files_on_disk=on_disk, files_indexed=0, chunks_indexed=0, fresh=False,
                    configured_provider=_provider_state(index, {})[0],
                    stale_reasons=["no index yet: run `clawmem index` (or start `clawmem serve`)"])
        return data
    try:  # a shared index's server that stalls (a lock, overload) is answered as a dead one is
        store = index.reader()
        files, chunks = store.counts()
        meta = store.meta.all()
        held = None
        if freshness.watched_pending is not None:
            pending_files = freshness.watched_pending()
            on_disk = freshness.watched_on_disk() if freshness.watched_on_disk else files
        else:
            on_disk, pending_files = freshness.disk_state(store)
            held = index.backend.files_held_by(store)
            if held is not None and on_disk == 0:  # a reader elsewhere: the writer's folder says what changed
                on_disk, pending_files = files, 0
            elif held is not None:  # files here, and another folder writes the workspace: they are not in it
                reasons.append(f"another folder (host {held}) writes this workspace of the shared index: this"
                               " folder's files are not in it (`clawmem take-over` moves it here)")
                held = None
        pending_embeddings = store.pending_embeddings() if has_vectors(store) else 0
        damage, batch_jobs, vector_search = store.damage(chunks), store.batch_jobs.job_count(), store.vectors.method()
    except IndexUnavailable as exc:
        data.update(fresh=False, stale_reasons=[str(exc)])
        return data
    fingerprint = json.loads(meta.get("fingerprint", "{}"))
    last = json.loads(meta.get("last_sync", "null") or "null") or {}
    failure = json.loads(meta.get("last_error", "null") or "null") or {}
    last_error = last_error or failure.get("error")
    provider, mismatch = _provider_state(index, fingerprint)
    if damage:
        reasons.append(f"{damage}: the next sync rebuilds it")
    if on_disk == 0:
        reasons.append("no memory files in the workspace (MEMORY.md or memory/**/*.md): is it the right folder?")
    if pending_files:
        reasons.append(f"{pending_files} file{'s' if pending_files != 1 else ''} changed since the last sync")
    if pending_embeddings:
        reasons.append(f"{pending_embeddings} chunk{'s' if pending_embeddings != 1 else ''} wait for a vector")
    embedding_error = meta.get(EMBEDDING_ERROR) if pending_embeddings else None
    if embedding_error:
        reasons.append(f"embedding failed: {embedding_error}")
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
    if held is not None:
        data["files_held_by"] = held
    if embedding_error:
        data["embedding_error"] = embedding_error  # the provider's last failure, kept by the pass that met it
    if index.provider_note:
        data["provider_note"] = index.provider_note
    return data


def _provider_state(index: Observed, built: dict[str, Any]) -> tuple[str, str | None]:
    """The configured provider/model, and why it differs from the index's (None when it does not)."""
    try:
        provider = index.provider
    except ProviderError as exc:
        return "unavailable", str(exc)
    if provider is None:
        current = {"provider": "none", "model": "", "endpoint": "", "dims": 0}
    else:
        info = provider.info
        current = {"provider": info.provider, "model": info.model, "endpoint": info.endpoint, "dims": info.dims}
    name = f"{current['provider']}/{current['model']}" if current["model"] else str(current["provider"])
    if any(built.get(k) != v for k, v in current.items()):
        return name, f"{built_otherwise(built, current)}: {index.rebuilt_by}"
    return name, None


def built_otherwise(built: dict[str, Any], current: dict[str, Any]) -> str:
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


def has_vectors(store: IndexStore) -> bool:
    return '"provider": "none"' not in (store.meta.get("fingerprint") or '"provider": "none"')


def record_sync(store: IndexStore, report: SyncReport) -> None:
    """The run's time and problems in `meta`, for `status`. A pass over some files (a watcher's) keeps
    the problems the last one found with the others: a file skipped as too large stays reported
    after an edit of another, until a pass finds it indexable (or gone)."""
    problems = [*report.errors, *report.skipped]
    count = len(problems)
    if report.scope is not None:
        last = json.loads(store.meta.get("last_sync") or "{}")
        before = list(last.get("problems", []))
        standing = [p for p in before if not any(p.startswith(f"{key}: ") for key in report.scope)]
        problems += standing
        count += int(last.get("problem_count", len(before))) - (len(before) - len(standing))
    store.meta.set("last_sync", json.dumps({
        "at": time.time(), "duration": report.duration, "problems": problems[:_KEPT_PROBLEMS],
        "problem_count": count, "embed_error": report.embed_error}))
    store.meta.delete("last_error")


def record_failure(backend: Backend[Any], exc: ClawmemError) -> None:
    """Remember a failed sync in the index, so `status` cannot call the index fresh (best effort)."""
    try:
        store = backend.open_live()
    except ClawmemError:
        return  # the index itself is out of reach (a shared index's server): nothing to write it in
    if store is None:
        return
    with contextlib.suppress(Exception):
        store.meta.set("last_error", json.dumps({"at": time.time(), "error": str(exc)}))
    store.close()
