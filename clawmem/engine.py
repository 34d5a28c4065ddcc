"""One workspace's index as a whole: keep it current, rebuild it atomically, answer queries.

This is the API the CLI and the daemon call; it knows nothing of sockets or terminals.

Writers (sync, rebuild) serialise on an flock beside the index file. A rebuild (fingerprint
changed, or `reindex`) is written into a private file next to the index and copied into the live
file with SQLite's backup API in a single write transaction: readers see the old index until the
new one is complete, and a rebuild killed at any point leaves the old index untouched. Its private
file is removed by the next writer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from clawmem import __version__
from clawmem.chunking import split_lines
from clawmem.config import Settings
from clawmem.embeddings.base import EmbeddingProvider
from clawmem.errors import IndexBusy, IndexCorrupt, IndexUnavailable, QueryError
from clawmem.search import SearchRequest, run_search
from clawmem.store import SCHEMA_VERSION, Store
from clawmem.sync import Progress, SyncReport, embed_pending, sync_workspace
from clawmem.workspace import resolve_memory_path, scan

__all__ = ["MemoryIndex"]

KEYWORD_FORMAT = "porter-unicode61+cjk-1"
_UNRESOLVED: Any = object()


class MemoryIndex:
    def __init__(self, settings: Settings, *, provider: EmbeddingProvider | None = _UNRESOLVED,
                 lock_timeout: float = 30.0, pending_files: Callable[[], int] | None = None) -> None:
        """`pending_files` counts files changed since the last sync; a watcher knows that without a scan."""
        self.settings = settings
        self._pending_files = pending_files
        self.path = settings.index_path
        self.lock_timeout = lock_timeout
        self._provider = provider
        self._provider_note = "" if provider is not _UNRESOLVED else None
        self._fallback_used = False
        self._local = threading.local()
        self._stores: list[Store] = []
        self._stores_lock = threading.Lock()
        self._provider_lock = threading.Lock()

    # -- provider ---------------------------------------------------------------------------

    @property
    def provider(self) -> EmbeddingProvider | None:
        if self._provider is _UNRESOLVED:
            with self._provider_lock:
                if self._provider is _UNRESOLVED:
                    self._resolve_provider()
        return self._provider  # type: ignore[no-any-return]

    def _resolve_provider(self) -> None:
        try:
            from clawmem.embeddings.registry import resolve_provider
        except ImportError:
            self._provider, self._provider_note = None, "embedding providers are not installed: keyword search only"
            return
        resolved = resolve_provider(self.settings.embedding, cache_dir=self.settings.cache_dir)
        self._provider = resolved.provider
        self._provider_note = resolved.reason
        self._fallback_used = resolved.fallback_used

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
        }

    # -- connections ------------------------------------------------------------------------

    def reader(self) -> Store:
        """This thread's connection to the live index (opened on first use; never creates the file)."""
        store: Store | None = getattr(self._local, "store", None)
        if store is None:
            if not self.path.exists():
                raise IndexUnavailable(f"no index at {self.path} yet: run `clawmem index` first")
            store = Store(self.path, create=False)
            self._local.store = store
            with self._stores_lock:
                self._stores.append(store)
        return store

    def close(self) -> None:
        with self._stores_lock:
            for store in self._stores:
                with contextlib.suppress(Exception):
                    store.close()
            self._stores.clear()
        self._local = threading.local()

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """The workspace's writer lock (flock: released by the kernel if the holder dies)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                        raise IndexBusy(f"another clawmem process is writing {self.path}") from None
                    time.sleep(0.05)
            self._remove_strays()
            yield
        finally:
            os.close(fd)

    def _remove_strays(self) -> None:
        for stray in self.path.parent.glob(f"{self.path.name}.rebuild-*"):
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()

    # -- writing ----------------------------------------------------------------------------

    def sync(self, *, progress: Progress | None = None, embed: bool = True,
             embed_progress: Progress | None = None, paths: Iterable[str] | None = None) -> SyncReport:
        """Bring the index in step with the files, rebuilding first if the fingerprint changed.

        `paths` limits the pass to those index keys (what a watcher saw change), so one edit costs
        the same in a workspace of any size.
        """
        with self.write_lock():
            fingerprint = json.dumps(self.fingerprint(), sort_keys=True)
            store = self._open_live()
            if store is not None and store.get_meta("fingerprint") == fingerprint:
                report = sync_workspace(store, self.settings, progress=progress, paths=paths)
            else:
                if store is not None:
                    store.close()
                report = self._rebuild(fingerprint, progress, embed)
                store = self._open_live()
                assert store is not None
                follow = sync_workspace(store, self.settings)  # what changed while it was built
                report.added += follow.added
                report.updated += follow.updated
                report.removed += follow.removed
            return self._finish(store, report, embed, embed_progress)

    def reindex(self, *, progress: Progress | None = None, embed: bool = True,
                embed_progress: Progress | None = None) -> SyncReport:
        """Rebuild from scratch whatever the fingerprint says (old index serves until the swap)."""
        with self.write_lock():
            report = self._rebuild(json.dumps(self.fingerprint(), sort_keys=True), progress, embed)
            store = self._open_live()
            assert store is not None
            return self._finish(store, report, embed, embed_progress)

    def _finish(self, store: Store, report: SyncReport, embed: bool, embed_progress: Progress | None) -> SyncReport:
        """Embed what is pending (vectors follow the keyword rows), record the sync, close."""
        try:
            if embed and self.provider is not None:
                embedded, error = embed_pending(
                    store, self.provider, cache_max_entries=self.settings.embedding.cache_max_entries,
                    progress=embed_progress)
                report.embedded += embedded
                report.embed_error = error
            store.set_meta("last_sync", json.dumps({"at": time.time(), "duration": report.duration}))
        finally:
            store.close()
        return report

    def _open_live(self) -> Store | None:
        """The live index, or None when there is none worth keeping (missing or damaged)."""
        if not self.path.exists():
            return None
        try:
            return Store(self.path, create=False)
        except IndexCorrupt:
            return None

    def _rebuild(self, fingerprint: str, progress: Progress | None, embed: bool) -> SyncReport:
        """Build a new index privately and swap it in.

        With an old index serving, vectors are made before the swap so searches keep their vectors
        throughout; with none, the keyword index goes live first and vectors follow in `sync`.
        """
        started = time.perf_counter()
        replacing = self._open_live()
        if replacing is not None:
            replacing.close()
        tmp = self.path.with_name(f"{self.path.name}.rebuild-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            fresh = Store(tmp, fast_unsafe=True)
            try:
                if self.path.exists():
                    with contextlib.suppress(Exception):
                        fresh.copy_cache_from(self.path)
                fresh.set_meta("fingerprint", fingerprint)
                report = sync_workspace(fresh, self.settings, progress=progress, bulk=True)
                if embed and replacing is not None and self.provider is not None:
                    report.embedded, report.embed_error = embed_pending(
                        fresh, self.provider, cache_max_entries=self.settings.embedding.cache_max_entries)
                self._swap_in(fresh)
            finally:
                fresh.close()
        finally:
            tmp.unlink(missing_ok=True)
        report.duration = time.perf_counter() - started
        return report

    def _swap_in(self, fresh: Store) -> None:
        live = self._open_live()
        if live is None:
            # No usable index (missing or not a database): nothing to keep serving, start a new file.
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            live = Store(self.path)
        try:
            with live.conn.backup("main", fresh.conn, "main") as backup:
                while not backup.done:
                    backup.step(-1)
        finally:
            live.close()

    # -- reading ----------------------------------------------------------------------------

    def search(self, request: SearchRequest) -> dict[str, object]:
        store = self.reader()
        mode = request.mode or self.settings.search.mode
        provider, mismatch = self._query_provider(store) if mode != "bm25" else (None, None)
        outcome = run_search(store, provider, request, self.settings.search)
        info = provider.info if provider is not None else None
        answer: dict[str, object] = {
            "results": [r.as_dict() for r in outcome.results],
            "provider": info.provider if info else "none",
            "model": info.model if info else "",
            "mode": outcome.mode,
            "index": {"pending_files": self.pending_files(store),
                      "pending_embeddings": store.pending_embeddings() if self._index_has_vectors(store) else 0},
        }
        if self._fallback_used:
            answer["fallback"] = True
        if mismatch or outcome.degraded:
            answer["warning"] = mismatch or outcome.degraded
        return answer

    def _query_provider(self, store: Store) -> tuple[EmbeddingProvider | None, str | None]:
        """The provider for query vectors, only if it made the index's vectors (other models' vectors don't compare)."""
        built = json.loads(store.get_meta("fingerprint") or "{}")
        if built.get("provider", "none") == "none":
            return None, None
        provider = self.provider
        if provider is None:
            return None, "no embedding provider available: keyword results only"
        info = provider.info
        if (info.provider, info.model, info.dims) != (built.get("provider"), built.get("model"), built.get("dims")):
            return None, (f"the index was built with {built.get('provider')}/{built.get('model')}, not "
                          f"{info.provider}/{info.model}: keyword results only until the next `clawmem index`")
        return provider, None

    @staticmethod
    def _index_has_vectors(store: Store) -> bool:
        return '"provider": "none"' not in (store.get_meta("fingerprint") or '"provider": "none"')

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < 1):
            raise QueryError("'from' must be a line number >= 1")
        if lines is not None and (not isinstance(lines, int) or isinstance(lines, bool) or lines < 1):
            raise QueryError("'lines' must be a count >= 1")
        real = resolve_memory_path(self.settings.workspace, path, self.settings.extra_paths)
        all_lines = split_lines(real.read_bytes().decode("utf-8", errors="replace"))
        first = start or 1
        picked = all_lines[first - 1:] if lines is None else all_lines[first - 1:first - 1 + lines]
        return {"path": path, "text": "\n".join(picked), "from": first, "lines": len(picked)}

    def pending_files(self, store: Store) -> int:
        """Files added, changed or deleted on disk since the last sync (stat only, nothing read)."""
        if self._pending_files is not None:
            return self._pending_files()
        indexed = store.files()
        pending = 0
        present = 0
        for f in scan(self.settings.workspace, self.settings.extra_paths):
            row = indexed.get(f.path)
            if row is None or (row.mtime, row.size) != (f.mtime_ns, f.size):
                pending += 1
            if row is not None:
                present += 1
        return pending + len(indexed) - present

    def status(self) -> dict[str, object]:
        on_disk = sum(1 for _ in scan(self.settings.workspace, self.settings.extra_paths))
        data: dict[str, object] = {
            "version": __version__,
            "workspace": str(self.settings.workspace),
            "index_path": str(self.path),
            "socket": str(self.settings.socket_path),
            "files_on_disk": on_disk,
            "index_exists": self.path.exists(),
        }
        if not self.path.exists():
            data.update(files_indexed=0, chunks_indexed=0, fresh=False)
            return data
        store = self.reader()
        files, chunks = store.counts()
        meta = store.all_meta()
        fingerprint = json.loads(meta.get("fingerprint", "{}"))
        last = json.loads(meta.get("last_sync", "null") or "null")
        pending_files = self.pending_files(store)
        pending_embeddings = store.pending_embeddings() if fingerprint.get("provider", "none") != "none" else 0
        data.update(
            files_indexed=files,
            chunks_indexed=chunks,
            fingerprint=fingerprint,
            provider=fingerprint.get("provider", "none"),
            model=fingerprint.get("model", ""),
            dims=fingerprint.get("dims", 0),
            sqlite_vec_loaded=store.vec_loaded,
            vector_search="sqlite-vec" if store.vec_loaded else "in-process cosine (sqlite-vec not loaded)",
            pending_files=pending_files,
            pending_embeddings=pending_embeddings,
            last_sync_at=last.get("at") if last else None,
            last_sync_duration=last.get("duration") if last else None,
            fresh=pending_files == 0,
            schema_version=int(meta.get("schema_version", "0")),
        )
        return data
