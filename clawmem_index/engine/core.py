"""One workspace's index as a whole: its provider and fingerprint, its connections, and the calls that keep it
current, rebuild it and answer queries.

This is the API the CLI and the daemon call; it knows nothing of sockets or terminals. Each side has its module:
writes and rebuilds (clawmem_index.engine.write), queries (clawmem_index.engine.query), freshness and `status`
(clawmem_index.engine.status).

The write path (clawmem_index.engine.write, which brings sync, the chunker and batch jobs) is imported by the
methods that write, so that a command that only reads (`search`, `status`, `get`) starts ~14 ms sooner.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from clawmem_index.config import Settings
from clawmem_index.embeddings.base import KEYWORDS_ONLY, EmbeddingProvider
from clawmem_index.engine.query import Queries
from clawmem_index.engine.status import Freshness, status
from clawmem_index.errors import IndexUnavailable
from clawmem_index.index.backends import backend_for
from clawmem_index.index.store import SCHEMA_VERSION
from clawmem_index.index.interface import IndexStore
from clawmem_index.search.ranking import SearchRequest

if TYPE_CHECKING:
    from clawmem_index.engine.sync import Progress, SyncReport

__all__ = ["MemoryIndex"]

# chunks carry their daily file's date; OpenClaw's annotations are their metadata, not words
KEYWORD_FORMAT = "porter-unicode61+cjk-1+dates+annotations"
_UNRESOLVED: Any = object()


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
        self._local = threading.local()
        self._stores: list[IndexStore] = []
        self._by_thread: dict[int, IndexStore] = {}  # thread ident -> its reader (see interrupt)
        self._stores_lock = threading.Lock()
        self._provider_lock = threading.Lock()
        self.freshness = Freshness(settings, self.backend, read_only=read_only, pending_files=pending_files,
                                   files_on_disk=files_on_disk)
        self._queries = Queries(self)

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
        return self._provider

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
            **({"precision": precision} if (precision := self.precision) != "float32" else {}),
        }

    @property
    def precision(self) -> str:
        """How this index stores its provider's vectors (`embedding.precision`, "auto" resolved by width)."""
        info = self.provider.info if self.provider is not None else None
        return self.settings.vector_precision(info.dims if info else 0)

    def fingerprint_json(self) -> str:
        """The fingerprint as stored in `meta` (and compared with it)."""
        return json.dumps(self.fingerprint(), sort_keys=True)

    # -- connections ------------------------------------------------------------------------

    def reader(self) -> IndexStore:
        """This thread's connection to the live index (opened on first use; never creates the file)."""
        store: IndexStore | None = getattr(self._local, "store", None)
        if store is None:
            if not self.backend.exists():
                raise IndexUnavailable(f"no index at {self.backend.describe()} yet: run `clawmem index` first")
            store = self.backend.open_reader(read_only=self.read_only, long_lived=self.long_lived)
            self._local.store = store
            with self._stores_lock:
                self._stores.append(store)
                self._by_thread[threading.get_ident()] = store
        else:
            self.backend.refresh(store)
        return store

    def interrupt(self, thread: int) -> None:
        """End the statement the reader of thread `thread` runs now (its query's client has gone)."""
        with self._stores_lock:
            store = self._by_thread.get(thread)
        if store is not None:
            store.interrupt()

    def has_been_built(self) -> bool:
        """Whether a sync ever completed into this index: until one has, a new daemon's queries wait."""
        return self.backend.exists() and self.reader().meta.get("last_sync") is not None

    def close(self) -> None:
        with self._stores_lock:
            for store in self._stores:
                with contextlib.suppress(Exception):
                    store.close()
            self._stores.clear()
            self._by_thread.clear()
        self._local = threading.local()
        self._queries.answers.clear()
        self.release_model()

    @property
    def resolved_provider(self) -> EmbeddingProvider | None:
        """The provider if it has been resolved (None otherwise, or when there is none): never resolves it."""
        return None if self._provider is _UNRESOLVED else self._provider

    def release_model(self) -> None:
        """End the model process of an isolated local model (the next embedding would start it again)."""
        provider = self.resolved_provider
        if self.isolate_local_model and provider is not None:
            provider.close()

    def write_lock(self) -> contextlib.AbstractContextManager[None]:
        """The workspace's writer lock, released if the holder dies (see clawmem_index.index.backends)."""
        return self.backend.write_lock(self.lock_timeout)


    # -- writing (clawmem_index.engine.write) -----------------------------------------------

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
        from clawmem_index.engine.write import Reporters, sync_or_rebuild, write

        bars = Reporters(progress, embed_progress, vectors_progress)
        return write(self, lambda fingerprint, store: sync_or_rebuild(self, fingerprint, store, bars, paths), embed,
                     bars, notify)

    def reindex(self, *, progress: Progress | None = None, embed: bool = True,
                embed_progress: Progress | None = None, notify: Callable[[str], None] | None = None,
                vectors_progress: Progress | None = None) -> SyncReport:
        """Rebuild from scratch whatever the fingerprint says (old index serves until the swap)."""
        from clawmem_index.engine.write import Reporters, rebuild, write

        bars = Reporters(progress, embed_progress, vectors_progress)
        return write(self, lambda fingerprint, store: (rebuild(self, fingerprint, bars, store), None), embed, bars,
                     notify)  # the connection to the new index is opened by `write`

    def open_writer(self) -> IndexStore | None:
        """A connection that may write the live index (the embedder's), None when there is none (missing or
        damaged)."""
        return self.backend.open_live()

    # -- reading (clawmem_index.engine.query) -----------------------------------------------

    def search(self, request: SearchRequest) -> dict[str, object]:
        return self._queries.search(request)

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        """Lines of one memory file, read from a descriptor opened beneath the workspace (see `Queries.get`)."""
        return self._queries.get(path, start, lines, max_bytes)

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, object]:
        """The search's best lines as one prompt block of at most `budget` tokens (see `Queries.context`)."""
        return self._queries.context(request, budget)

    def curated(self, kind: str | None = None, limit: int = 512,
                projects: Sequence[str] | None = None) -> dict[str, object]:
        """The annotated entries of MEMORY.md and USER.md, as the files are now (see `Queries.curated`)."""
        return self._queries.curated(kind, limit, projects)

    # -- freshness (clawmem_index.engine.status) --------------------------------------------

    def pending_files(self, store: IndexStore) -> int:
        """Files added, changed or deleted on disk since the last sync (stat only, nothing read)."""
        return self.freshness.pending_files(store)

    def disk_state(self, store: IndexStore | None) -> tuple[int, int]:
        """(files of the configured sources on disk, files changed since the last sync), by one stat scan."""
        return self.freshness.disk_state(store)

    def status(self, *, last_error: str | None = None) -> dict[str, object]:
        """What is indexed, with which model, how fresh it is, and every reason it is not (see `status.status`)."""
        return status(self, last_error=last_error)
