"""Answer queries over one index: `search` (its answers cached, its query vectors given a deadline), `get`, `context`.

Searches never wait long for a provider: a query vector has `search.query_timeout` seconds,
after which the answer is keyword-only and says so.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from clawmem_index.config import MAX_CONTEXT_BUDGET, Settings, workspace_id
from clawmem_index.embeddings.base import EmbeddingProvider
from clawmem_index.engine.embed import EMBEDDING_ERROR
from clawmem_index.engine.status import Freshness, built_otherwise, has_vectors
from clawmem_index.errors import PathError, ProviderError, QueryError
from clawmem_index.index.interface import IndexStore, SharedReads
from clawmem_index.search.query_cache import QueryCache
from clawmem_index.search.ranking import NO_VECTORS, SearchOutcome, SearchRequest, run_search
from clawmem_index.sources.files import GET_MAX_BYTES, Window, count_lines, read_window
from clawmem_index.sources.paths import PROFILE_FILE, open_memory_file, reads_annotations
from clawmem_index.text.annotations import INVALID_PROJECTS, Entry, curated_entries

if TYPE_CHECKING:
    from clawmem_index.embeddings.deadline import QueryDeadline
    from clawmem_index.index.backends import Backend

__all__ = ["CACHED_RESULTS", "Queries", "Served"]

CONTEXT_READ_BYTES = 1 << 20  # at least this much of each range of hit lines is read for `context`
CACHED_RESULTS = 50  # answers with more results are not kept by the query cache
# The curated memory whose annotated entries a host may put in front of its model unasked (OpenClaw's lane 1
# and project block read these two alone); each is read up to this much, as it is now.
CURATED_PATHS = ("MEMORY.md", PROFILE_FILE)
CURATED_READ_BYTES = 4 << 20
CURATED_KINDS = ("triggers", "projects")
CURATED_TEXT_CHARS = 4000  # of one entry's text in an answer (a host shows at most 600-1800 of it)


class Served(Protocol):
    """What the read side reads of its index (`MemoryIndex` is one): settings, a reader per thread, how fresh the
    files are, and the provider query vectors come from."""

    settings: Settings
    backend: Backend[Any]
    freshness: Freshness
    provider_note: str  # why the provider is what it is ("" when as configured)
    fallback_used: bool  # the provider is `auto`'s fallback, not the one asked for

    @property
    def provider(self) -> EmbeddingProvider | None: ...

    def reader(self) -> IndexStore: ...


class Queries:
    """The read side of an index: its answers kept (the query cache) and its provider for query vectors."""

    def __init__(self, index: Served) -> None:
        self.index = index
        search = index.settings.search
        self.answers: QueryCache[SearchOutcome] = QueryCache(search.cache_entries, search.cache_seconds)
        self.deadline: QueryDeadline | None = None  # the provider behind a deadline, made at the first vector query
        self._entries: dict[str, tuple[tuple[int, ...], list[Entry], bool]] = {}  # path -> (stat, entries, cut)
        self._reading = threading.Lock()  # one parse of the curated files at a time: the others wait for its result

    def search(self, request: SearchRequest) -> dict[str, object]:
        index = self.index
        store = index.reader()
        unseen = self._scope(store, request)
        mode = request.mode or index.settings.search.mode
        provider, note = self._query_provider(store) if mode != "bm25" else (None, None)
        # "yesterday" means another day after midnight: an answer kept from before then is not this one
        key = (store, store.data_version(), request, index.settings.search, provider is None,
               dt.date.today() if request.now is None else None)
        outcome = self.answers.get(key)
        pending = index.freshness.start_query_check(store) if outcome is None else None
        if outcome is None:
            outcome = run_search(store, provider, request, index.settings.search)
            # Not kept: an answer a failing provider degraded (it may answer the next time), nor a
            # large one (the cache's memory stays ~256 x 50 snippets, whatever clients ask for).
            if outcome.degraded is None and len(outcome.results) <= CACHED_RESULTS:
                self.answers.put(key, outcome)
        # Whose vectors the index holds (a keyword-only answer from an index with vectors says so too).
        built = json.loads(store.meta.get("fingerprint") or "{}")
        answer: dict[str, object] = {
            "results": [r.as_dict() for r in outcome.results],
            "provider": built.get("provider", "none"),
            "model": built.get("model", ""),
            "mode": outcome.mode,
            "index": {**(pending() if pending is not None else index.freshness.query_pending_files(store)),
                      "pending_embeddings": store.pending_embeddings() if has_vectors(store) else 0},
        }
        if index.fallback_used:
            answer["fallback"] = True
            answer["fallback_reason"] = index.provider_note
        warning = note or outcome.degraded
        failed = self._embedding_failure(store, mode, outcome, answer)
        if failed is not None:
            answer["embedding_error"] = failed
            warning = (f"no vectors: the embedding provider failed ({failed}): keyword results only"
                       if outcome.degraded == NO_VECTORS else
                       "; ".join(filter(None, [warning, f"chunks without a vector wait on a failed embedding "
                                                         f"provider ({failed})"])))
        if warning:
            answer["warning"] = warning
        if unseen:
            answer["unreadable_workspaces"] = unseen
        if outcome.extra.get("query"):
            answer["query"] = outcome.extra["query"]  # how the query was read (typos, dates), when not as typed
        return answer

    @staticmethod
    def _embedding_failure(store: IndexStore, mode: str, outcome: SearchOutcome,
                           answer: dict[str, object]) -> str | None:
        """Why vectors a meaning search needed are missing, when it is the provider's last failure: the answer must
        not say they are still being made when nothing can make them (a refused key)."""
        if mode == "bm25":
            return None
        waiting = answer["index"]["pending_embeddings"]  # type: ignore[index]
        if not waiting and outcome.degraded != NO_VECTORS:
            return None
        return store.meta.get(EMBEDDING_ERROR)

    def _scope(self, store: IndexStore, request: SearchRequest) -> list[str]:
        """Point a shared index's reader at the workspaces asked for; those it cannot see (absent or not granted)."""
        own = self.index.settings.workspace_id
        asked = tuple(dict.fromkeys(workspace_id(name) for name in request.workspaces or ()))
        if not isinstance(store, SharedReads):
            if asked and asked != (own,):
                raise QueryError("only a shared index (index_backend = \"postgres\") searches other workspaces")
            return []
        if any(not name for name in asked):
            raise QueryError("'workspaces' holds a name without a letter or digit")
        store.scope = asked or (own,)
        store.data_version()
        return [name for name in store.scope if name not in store.visible()]

    def _query_provider(self, store: IndexStore) -> tuple[EmbeddingProvider | None, str | None]:
        """The provider for query vectors, with a deadline, only if it made the index's vectors.

        Vectors of other models do not compare; a provider that cannot start leaves keyword search.
        """
        built = json.loads(store.meta.get("fingerprint") or "{}")
        try:
            provider = self.index.provider
        except ProviderError as exc:
            return None, f"{exc}: keyword results only"
        if provider is None:
            note = self.index.provider_note or "no embedding provider available"
            return None, note if "keyword search only" in note else f"{note}: keyword results only"
        if built.get("provider", "none") == "none":
            return None, "the index has no vectors yet (the next sync adds them): keyword results only"
        info = provider.info
        if (info.provider, info.model, info.endpoint, info.dims) != (
                built.get("provider"), built.get("model"), built.get("endpoint", info.endpoint), built.get("dims")):
            current = {"provider": info.provider, "model": info.model, "endpoint": info.endpoint, "dims": info.dims}
            return None, f"{built_otherwise(built, current)}: keyword results only until the next sync rebuilds it"
        if self.deadline is None:
            from clawmem_index.embeddings.deadline import QueryDeadline

            search = self.index.settings.search
            self.deadline = QueryDeadline(provider, search.query_timeout, first_use=search.first_query_timeout)
        return self.deadline, None

    def curated(self, kind: str | None = None, limit: int = 512,
                projects: Sequence[str] | None = None) -> dict[str, object]:
        """The annotated entries of MEMORY.md and USER.md as the files are now, the most important first.

        `kind` "triggers" or "projects" keeps those with trigger phrases or repository keys. `projects` (the
        repositories being worked in) keeps, before the limit, only entries scoped to none or all within them, as
        OpenClaw's memory-core does. Each file is read (at most CURATED_READ_BYTES) only when its stat changed
        since the last call; an entry's text is cut at CURATED_TEXT_CHARS (`text_truncated`).
        """
        if kind is not None and kind not in CURATED_KINDS:
            raise QueryError(f"'kind' must be one of {', '.join(CURATED_KINDS)}")
        if not 1 <= limit <= 512:
            raise QueryError("'limit' must be between 1 and 512")
        found: list[tuple[str, Entry]] = []
        cut: list[str] = []
        active = None if projects is None else frozenset(projects)
        with self._reading:
            read = [(path, *self._curated_file(path)) for path in CURATED_PATHS]
        for path, entries, truncated in read:
            found.extend((path, e) for e in entries if e.annotations and (
                kind is None or getattr(e.annotations, kind) is not None)
                and (active is None or _scoped_within(e.annotations.projects, active)))
            if truncated:
                cut.append(path)
        found.sort(key=lambda pe: (-(pe[1].annotations.importance or 0), pe[0], pe[1].start_line))
        answer: dict[str, object] = {"entries": [_entry(path, e) for path, e in found[:limit]]}
        if cut:
            answer["truncated"] = cut  # read only up to CURATED_READ_BYTES: entries past it are not listed
        return answer

    def _curated_file(self, path: str) -> tuple[list[Entry], bool]:
        try:
            with self._open(path) as opened:
                st = opened.stat
                stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
                kept = self._entries.get(path)
                if kept is not None and kept[0] == stamp:
                    return kept[1], kept[2]
                window = read_window(opened.fd, 1, None, CURATED_READ_BYTES)
        except PathError:
            self._entries.pop(path, None)
            return [], False  # not there, or not memory now (a symlink, `user_profiles = false`): nothing to list
        entries = curated_entries(window.text, project_scoped=reads_annotations(path)[1])
        self._entries[path] = (stamp, entries, window.truncated)
        return entries, window.truncated

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        """Lines of one memory file, read from a descriptor opened beneath the workspace
        (see clawmem_index.sources.files).

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

        settings = self.index.settings
        budget = settings.search.context_budget if budget is None else budget
        if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= MAX_CONTEXT_BUDGET:
            raise QueryError(f"'budget' must be between 0 and {MAX_CONTEXT_BUDGET} tokens")
        if request.source not in (None, "memory"):
            raise QueryError("the context block is made of memory files: leave 'source' out")
        answer = self.search(replace(request, source="memory"))  # another workspace on SQLite: a QueryError
        results: list[dict[str, Any]] = answer.pop("results")  # type: ignore[assignment]
        own = settings.workspace_id
        hits = [Hit(r["path"], r["start_line"], r["end_line"], r["score"],
                    None if r.get("workspace", own) == own else r["workspace"]) for r in results]
        tokenizer = settings.chunking.tokenizer
        # Hits are a few KiB of lines each; only a line longer than any that fits (text of n bytes is at
        # least n / MAX_TOKEN_BYTES tokens) may be cut short by the read, and is then left out.
        room = max((budget + 1) * MAX_TOKEN_BYTES, CONTEXT_READ_BYTES)
        # the search's connection
        shared = self.index.reader() if any(hit.workspace is not None for hit in hits) else None
        store = shared if isinstance(shared, SharedReads) else None

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
        """A memory file opened beneath the workspace, with every rule `get` applies
        (see clawmem_index.sources.files)."""
        settings = self.index.settings
        return open_memory_file(settings.workspace, path, settings.extra_paths,
                                refuse_hardlinks=settings.refuse_hardlinks, exclude=settings.excluded)


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


def _scoped_within(projects: str | None, active: frozenset[str]) -> bool:
    """An entry scoped to no repository, or only to active ones (an unreadable scope never is)."""
    if projects is None:
        return True
    keys = {key.strip() for key in projects.split(";")} - {""}
    return bool(keys) and INVALID_PROJECTS not in keys and keys <= active


def _entry(path: str, entry: Entry) -> dict[str, object]:
    notes = entry.annotations
    text = entry.text if len(entry.text) <= CURATED_TEXT_CHARS else entry.text[:CURATED_TEXT_CHARS]
    data: dict[str, object] = {"path": path, "start_line": entry.start_line, "end_line": entry.end_line,
                               "text": text}
    if text is not entry.text:
        data["text_truncated"] = True
    data.update((key, value) for key, value in (("importance", notes.importance), ("triggers", notes.triggers),
                                                ("projects", notes.projects)) if value is not None)
    return data
