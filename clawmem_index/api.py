"""The public Python client: clawmem's queries from any program, answered the way the CLI answers them.

    from clawmem_index import Client

    with Client(workspace="~/agent") as memory:
        for hit in memory.search("why sqlite", max_results=3)["results"]:
            print(hit["path"], hit["start_line"], hit["snippet"])
        prompt_block = memory.context("why sqlite", budget=800)["text"]

Answers are the socket API's objects (SPEC §7) as plain dicts, so a program can move between this
client, the socket and `clawmem ... --json` without translating. Settings come from the same places
as the CLI's (the workspace's clawmem.toml or `config`, then CLAWMEM_* variables, then these keyword
arguments), so the client finds the daemon the CLI would find.

Where the answers come from: the workspace's daemon when one answers on its socket; otherwise the
index file itself, opened read-only (SQLite refuses any write on that connection, and sync or
reindex are refused), so a client is never a second writer beside the daemon. A daemon that turns
the client away (every connection busy) or stops answering is not an error: that question is
answered from the index file, and the daemon is looked for again DAEMON_RETRY seconds later. The
CLI's query commands are this client.

Errors are the `clawmem_index.errors` classes, the same whichever way the answer came: parameters are
checked here by the socket protocol's own rules before anything is sent.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from clawmem_index.errors import DaemonUnreachable, QueryError, ServerBusy
from clawmem_index.service.client import CALL_TIMEOUT, DaemonClient

if TYPE_CHECKING:
    from clawmem_index.config import Settings
    from clawmem_index.engine.core import MemoryIndex

__all__ = ["DAEMON_RETRY", "Client", "coverage_notes", "daemon_differs"]

DAEMON_RETRY = 2.0  # seconds between looks for a daemon while the index file answers

StrPath = str | os.PathLike[str]


class Client:
    """Search, read and summarise one workspace's memory (thread-safe; usable again after `close`).

    `workspace` defaults to CLAWMEM_WORKSPACE, else the current directory; `config`, `socket`,
    `index` and `provider` override the settings as the CLI's flags of the same names do. A
    workspace that does not exist, or a bad setting, is an error here rather than at the first query.
    `timeout` bounds each answer from the daemon (None: wait as long as it takes).
    """

    def __init__(self, workspace: StrPath | None = None, *, config: StrPath | None = None,
                 socket: StrPath | None = None, index: StrPath | None = None, provider: str | None = None,
                 timeout: float | None = CALL_TIMEOUT) -> None:
        from clawmem_index.config import check_workspace, load_settings

        overrides = {"index": _path(index), "socket": _path(socket), "embedding.provider": provider}
        self._settings: Settings = load_settings(workspace=_path(workspace), config_file=_path(config),
                                                 overrides=overrides)
        check_workspace(self._settings.workspace)
        self.timeout = timeout
        self._lock = threading.Lock()
        # One connection for the client's life, made again when it is lost: never a stray one to leak.
        self._daemon = DaemonClient(self._settings.socket_path, timeout=timeout)
        self._daemon_back = 0.0  # time.monotonic() before which the daemon is not asked (it just failed)
        self._index: MemoryIndex | None = None
        self._last: Literal["daemon", "index"] | None = None
        # An index or provider asked for by name must be the daemon's too, else the daemon is not asked.
        self._asked_index = index is not None
        self._asked_provider = provider if provider not in (None, "auto") else None
        self._daemon_checked = not (self._asked_index or self._asked_provider)
        self.daemon_differs: str | None = None
        """Why the workspace's daemon was bypassed: it serves another index or provider than asked for."""

    # -- where it points ---------------------------------------------------------------------

    @property
    def workspace(self) -> Path:
        return self._settings.workspace

    @property
    def socket_path(self) -> Path:
        return self._settings.socket_path

    @property
    def index_path(self) -> Path:
        return self._settings.index_path

    @property
    def served_by(self) -> Literal["daemon", "index"] | None:
        """Who answered the last question: the daemon, the index file read in-process, or nobody yet."""
        return self._last

    # -- the questions -----------------------------------------------------------------------

    def search(self, query: str, *, max_results: int | None = None, min_score: float | None = None,
               mode: str | None = None, path_prefix: str | None = None, source: str | None = None,
               since: str | None = None, before: str | None = None, explain: bool = False,
               workspaces: Sequence[str] | None = None, now: str | None = None,
               projects: Sequence[str] | None = None) -> dict[str, Any]:
        """The best chunks for `query`, as the socket's `search` answers them (`explain`: how each got its place).

        `workspaces`: in a shared index (index_backend postgres), search these workspaces (each result
        then names its `workspace`; those this role cannot read are listed in `unreadable_workspaces`).

        `{results: [{path, start_line, end_line, score, snippet, source, ...}], provider, model, mode,
        index: {pending_files, pending_embeddings}, fallback?, warning?}`. `mode` is hybrid, bm25 or
        vector; `source` memory or sessions; `since`/`before` ISO dates (inclusive/exclusive) on dated
        chunks (daily files, transcripts). Days the query names ("yesterday", "March 3") pull notes dated
        near them up; relative ones count from `now` (an ISO date or time; default today), and the answer's
        `query` says how the query was read (`dates`, `corrected` typos) when not as typed. `projects`: the
        repositories being worked in (OpenClaw's project keys): entries annotated `<!-- project: KEY -->` for
        them rank higher, those for others lower. A result from annotated entries carries their `importance`,
        `triggers` and `projects`.
        """
        return self._ask("search", {"query": query, "max_results": max_results, "min_score": min_score,
                                    "mode": mode, "path_prefix": path_prefix, "source": source, "since": since,
                                    "before": before, "explain": explain or None,
                                    "workspaces": list(workspaces) if workspaces else None, "now": now,
                                    "projects": list(projects) if projects else None})

    def get(self, path: StrPath, *, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, Any]:
        """Lines of one memory file: `{path, text, from, lines, truncated, next_from?}`.

        `path` is workspace-relative; anything but a memory file (`..`, outside paths, symlinks,
        other files) is refused with PathError. A long answer is cut at whole lines
        (`truncated`, and `next_from` to go on from).
        """
        from clawmem_index.sources.files import path_key

        return self._ask("get", {"path": path_key(os.fspath(path)), "from": start, "lines": lines,
                                 "max_bytes": max_bytes})

    def status(self) -> dict[str, Any]:
        """What is indexed, with which model, how fresh it is (and the daemon's state when it answers)."""
        return self._ask("status", {})

    def context(self, query: str, *, budget: int | None = None, max_results: int | None = None,
                min_score: float | None = None, mode: str | None = None, path_prefix: str | None = None,
                source: str | None = None, since: str | None = None, before: str | None = None,
                workspaces: Sequence[str] | None = None, now: str | None = None) -> dict[str, Any]:
        """The prompt block for `query`: whole lines of the best hits, grouped by file, in `budget` tokens.

        `workspaces`: in a shared index, gather from these workspaces (as `search` does); another
        workspace's lines are the index's text of its files, its sections carry `workspace` and are
        labelled `workspace:path#Lstart-Lend`.

        `{text, tokens, budget, tokenizer, sections: [{path, start_line, end_line, score, citation, workspace?}],
        hits, truncated, omitted_lines, provider, model, mode, index}`; `text` is empty when nothing
        matched or nothing fits. `budget` defaults to the `search.context_budget` setting.
        """
        return self._ask("context", {"query": query, "budget": budget, "max_results": max_results,
                                     "min_score": min_score, "mode": mode, "path_prefix": path_prefix,
                                     "source": source, "since": since, "before": before,
                                     "workspaces": list(workspaces) if workspaces else None, "now": now})

    def curated(self, kind: str | None = None, *, limit: int | None = None,
                projects: Sequence[str] | None = None) -> dict[str, Any]:
        """The annotated entries of MEMORY.md and USER.md, read from the files as they are now, most important
        first: `{entries: [{path, start_line, end_line, text, importance?, triggers?, projects?}], truncated?}`.

        `kind` "triggers" keeps the entries with trigger phrases (what a host matches against each message),
        "projects" those scoped to repositories. `projects`: the repositories being worked in (only entries
        scoped to none or all within them). `text` is the entry without its annotations.
        """
        return self._ask("curated", {"kind": kind, "limit": limit, "projects": list(projects) if projects is not None
                                     else None})

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Hang up on the daemon and close the index file (a later question opens what it needs again)."""
        with self._lock:
            index, self._index = self._index, None
            self._daemon_back = 0.0
        self._daemon.close()
        if index is not None:
            index.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(workspace={str(self.workspace)!r})"

    # -- how a question is answered ----------------------------------------------------------

    def _ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        from clawmem_index.service.params import validate_params
        from clawmem_index.service.replies import RpcError

        try:
            checked = validate_params(method, {k: v for k, v in params.items() if v is not None})
        except RpcError as exc:
            raise QueryError(exc.message) from None
        if time.monotonic() >= self._daemon_back:
            try:
                if not self._daemon_checked:
                    self._check_daemon()
            except (DaemonUnreachable, ServerBusy):
                self._daemon_back = time.monotonic() + DAEMON_RETRY
        if time.monotonic() >= self._daemon_back:
            try:
                answer: dict[str, Any] = self._daemon.call(method, checked, timeout=self.timeout)
                self._last = "daemon"
                return answer
            except (DaemonUnreachable, ServerBusy):  # none listening, lost, or every connection busy
                self._daemon_back = time.monotonic() + DAEMON_RETRY
        answer = self._answer_here(method, checked)
        self._last = "index"
        return answer

    def _check_daemon(self) -> None:
        """Bypass the daemon for good when it serves another index or provider than this client asked for.

        Its answers would silently be about its own settings; the index read here is the one asked
        for, read-only, with the provider asked for (a provider that cannot start says so).
        """
        status = self._daemon.call("status", {}, timeout=self.timeout)
        self._daemon_checked = True
        differs = daemon_differs(status, self._settings, index=self._asked_index, provider=self._asked_provider)
        if differs:
            pid = (status.get("daemon") or {}).get("pid")
            self.daemon_differs = (f"the daemon of this workspace (pid {pid}) was not asked: " + "; ".join(differs)
                                   + ". Answered here, from the index file, read-only")
            self._daemon_back = math.inf

    def _answer_here(self, method: str, p: dict[str, Any]) -> dict[str, Any]:
        from clawmem_index.service.params import search_request

        with self._lock:
            if self._index is None:
                from clawmem_index.engine.core import MemoryIndex

                self._index = MemoryIndex(self._settings, read_only=True)
                if self.daemon_differs:  # its writes are the daemon's, with the daemon's own provider
                    self._index.rebuilt_by = ("the daemon serving this workspace keeps its own provider and will not"
                                              " rebuild it: stop the daemon, then run `clawmem index` with this one")
            index = self._index
        if method == "search":
            return index.search(search_request(p))
        if method == "context":
            return index.context(search_request(p), p.get("budget"))
        if method == "get":
            return index.get(p["path"], p.get("from"), p.get("lines"), p.get("max_bytes"))
        if method == "curated":
            return index.curated(p.get("kind"), p.get("limit", 512), p.get("projects"))
        return index.status()


def daemon_differs(status: Mapping[str, Any], settings: Settings, *, index: bool, provider: str | None) -> list[str]:
    """How a daemon (its `status`) serves another index or provider than asked for by name (`index`: an
    index path was given; `provider`: a provider named, not auto), in words; empty when it serves those."""
    differs = []
    if index and Path(str(status.get("index_path"))) != settings.index_path:
        differs.append(f"its index is {status.get('index_path')}, not {settings.index_path}")
    serving = str(status.get("configured_provider") or "")  # "provider/model", or "none"
    if provider and provider != "auto" and serving and serving.split("/")[0] != provider:  # "": an older daemon
        differs.append(f"it uses provider {serving}, not {provider}")
    return differs


def coverage_notes(answer: Mapping[str, Any]) -> list[str]:
    """What a search or context answer does not cover yet, in words (its `index` counts say the same):
    files changed since the last sync, and for a hybrid or vector answer, chunks without a vector."""
    index = answer.get("index") or {}
    notes = []
    files = index.get("pending_files") or 0
    if files:
        least = "" if index.get("pending_files_complete", True) else "at least "
        notes.append(f"{least}{files} file(s) changed since the last sync: not in this answer yet")
    waiting = index.get("pending_embeddings") or 0
    if waiting and answer.get("mode") in ("hybrid", "vector"):
        notes.append(f"{waiting} chunk(s) wait for a vector: meaning search does not cover them yet"
                     + (" (keyword search does)" if answer.get("mode") == "hybrid" else ""))
    return notes


def _path(value: StrPath | None) -> str | None:
    return None if value is None else os.fspath(value)
