"""`clawmem serve`: one process per workspace that keeps the index current and answers on the socket.

Wiring and lifecycle only; each part lives in its own module (lock, writer, watcher, server, systemd).
The start-up order is the design:

1. the instance lock (`clawmem_index.service.lock`: a stale lock from a killed daemon is simply
   free, and its leftover socket file is known to be stale and replaced);
2. the embedding provider, so one named in the settings that cannot start (no key, no model) is
   an error at once rather than a keyword-only index built in its place;
3. the writer thread (keyword syncs and rebuilds) and the embedding thread, idle;
4. the watcher, before the first sync, so nothing written during that sync is missed (its events
   coalesce into one follow-up run);
5. the first sync, queued for the writer;
6. the socket, listening (inherited from systemd socket activation when LISTEN_FDS says so), so
   queries are answered from the existing index while the first sync runs; then READY=1.

Signals are turned into bytes on a pipe (`signal.set_wakeup_fd`) that the main thread reads, so
no lock is ever taken inside a signal handler: SIGTERM/SIGINT stop the daemon (the writer ends
after the transaction in flight, the socket file is removed, exit status 0), SIGHUP reloads the
configuration.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawmem_index import __version__
from clawmem_index.config import Settings, check_workspace
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ClawmemError, IndexUnavailable
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.embedder import Embedder
from clawmem_index.service.listener import listen
from clawmem_index.service.lock import InstanceLock
from clawmem_index.service.process import IdleWatch, end_now, resident_bytes
from clawmem_index.service.server import RpcServer
from clawmem_index.service.systemd import Notifier, listen_fds
from clawmem_index.service.watcher import ObserverFactory, WorkspaceWatcher
from clawmem_index.service.writer import Run, Writer

if TYPE_CHECKING:
    from clawmem_index.embeddings.base import EmbeddingProvider

FIRST_PASS_NOTE = ("this workspace's first index is still being built: the answer holds the files indexed so far"
                   " (MEMORY.md, USER.md and the latest daily notes first)")

__all__ = ["Daemon", "run_daemon"]

STOP_TIMEOUT = 20.0
_STOP_BYTE = 0
_UNSET: Any = object()


class Daemon:
    """The running service: also the socket's Backend (search/get/status/context/sync/reindex)."""

    def __init__(self, settings: Settings, *, reload_settings: Callable[[], Settings] | None = None,
                 provider: EmbeddingProvider | None = _UNSET, notifier: Notifier | None = None,
                 log: Any = None, environ: MutableMapping[str, str] | None = None,
                 observer_factory: ObserverFactory | None = None, polling_factory: ObserverFactory | None = None,
                 query_workers: int = 8) -> None:
        from clawmem_index.log import get_logger

        self.settings = settings
        self._reload_settings = reload_settings
        self._provider = provider
        self._environ = os.environ if environ is None else environ
        self.notifier = notifier or Notifier(self._environ)
        self.log = log or get_logger("clawmem_index.service.daemon")
        self._observer_factory = observer_factory
        self._polling_factory = polling_factory
        self._query_workers = query_workers
        self.index = self._new_index(settings)
        self._retired: list[MemoryIndex] = []
        self.writer = Writer(lambda: self.index, log=self.log, on_run=self._on_run, on_progress=self._on_progress)
        self.embedder = Embedder(lambda: self.index, log=self.log, on_run=self._on_run)
        self._on_disk: int | None = None
        self._scanned: tuple[int, tuple[int, int]] | None = None  # (full passes seen, disk state) of the last scan
        self.server: RpcServer | None = None
        self.watcher: WorkspaceWatcher | None = None
        self.socket_path: Path | None = None
        self.socket_activated = False
        self._lock: InstanceLock | None = None
        self._stopped = threading.Event()
        self.abandoned = False  # stopped with queries still running (see stop)
        self._first_build = threading.Event()  # a query may be answered: the first index has a file in it
        self._first_pass = True  # ... until its whole first pass is done, answers say they are partial
        self._started_at = time.monotonic()
        self._wake_w: int | None = None
        self.reloads = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Everything but the signal handling (see `serve_forever`); raises IndexBusy if already running."""
        settings = self.settings
        check_workspace(settings.workspace)
        self.index.provider  # noqa: B018 - a provider named in the settings that cannot start stops us here
        inherited = listen_fds(self._environ)
        try:
            listener, path, self._lock, self.socket_activated = listen(settings, inherited, self.log)
        except BaseException:
            for sock in inherited:
                sock.close()
            raise
        self.socket_path = path
        try:
            self.writer.start()
            self.embedder.start()
            self.watcher = self._new_watcher(settings)
            self.watcher.start()
            if self.index.has_been_built():
                self._first_build.set()
                self._first_pass = False
            elif self.index.backend.name == "sqlite" and self.index.backend.exists():
                # a first index cut short: answered from what it holds (and said so) as it goes on
                self._first_build.set()
            self.writer.request_sync("startup")
            self.server = RpcServer(self, listener, path=None if self.socket_activated else path,
                                    idle_timeout=settings.daemon.idle_timeout, workers=self._query_workers,
                                    log=self.log)
            self.server.start()
        except BaseException:
            self.stop()
            raise
        self._started_at = time.monotonic()
        self.log.info("started", version=__version__, workspace=str(settings.workspace), socket=str(path),
                      socket_activated=self.socket_activated, index=str(settings.index_path),
                      watcher=self.watcher.mode, pid=os.getpid())
        self.notifier.ready(f"serving {settings.workspace} on {path}")
        if self.notifier.watchdog_interval:
            threading.Thread(target=self._watchdog_loop, args=(self.notifier.watchdog_interval,),
                             name="clawmem-watchdog", daemon=True).start()
        if settings.daemon.exit_when_idle:
            IdleWatch(settings.daemon.exit_when_idle, self._busy,
                      lambda: self.server.served if self.server is not None else 0, self._idle_exit,
                      self._stopped).start()

    def stop(self) -> None:
        """Stop serving: idempotent, and safe after a partial start."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.notifier.stopping()
        self.log.info("stopping")
        if self.server is not None:
            self.server.stop_listening()
        if self.watcher is not None:
            self.watcher.stop()
        if not self.writer.stop(STOP_TIMEOUT):
            self.log.warning("writer_still_running", action="exiting anyway; the index stays consistent")
        if not self.embedder.stop(STOP_TIMEOUT / 4):
            self.log.warning("provider_call_in_flight", action="exiting anyway; pending vectors stay pending")
        if self.server is not None and not self.server.close():
            # A query still waits (on a provider that does not answer): its index stays open under it, and the
            # process ends without waiting for it (run_daemon). It only reads: nothing is lost.
            self.abandoned = True
            self.log.warning("queries_still_running", action="exiting anyway; they only read the index")
        if not self.abandoned:
            for index in (*self._retired, self.index):
                index.close()
        if self._lock is not None:
            self._lock.release()
        self.notifier.close()
        self.log.info("stopped")

    def request_stop(self) -> None:
        """Ask `serve_forever` to stop (from any thread)."""
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, bytes([_STOP_BYTE]))

    def serve_forever(self) -> int:
        """Start, then block the main thread on signals until SIGTERM/SIGINT; returns the exit status."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._wake_w = write_fd
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {sig: signal.signal(sig, _ignore_signal) for sig in handled}
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        try:
            self.start()
            while True:
                received = os.read(read_fd, 64)
                if signal.SIGHUP in received:
                    self.reload()
                stops = [b for b in received if b in (signal.SIGTERM, signal.SIGINT, _STOP_BYTE)]
                if stops:
                    self.log.info("signal", signal=_signal_name(stops[0]))
                    break
        finally:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._wake_w = None
            self.stop()
            os.close(read_fd)
            os.close(write_fd)
        return 0

    def reload(self) -> None:
        """SIGHUP: read the configuration again; workspace, socket and index stay as they are."""
        if self._reload_settings is None:
            return
        self.notifier.reloading()
        old = self.settings
        try:
            fresh = self._reload_settings()
        except ClawmemError as exc:
            self.log.error("reload_failed", error=str(exc), action="keeping the previous configuration")
            self.notifier.send("READY=1", "STATUS=reload failed: keeping the previous configuration")
            return
        kept = replace(fresh, workspace=old.workspace, index=old.index_path, socket=old.socket)
        # Same embedding settings: the new index keeps the provider (and the local model's process).
        same = kept.embedding == old.embedding and self.index.resolved_provider is not None
        index = self._new_index(kept, self.index.resolved_provider if same else _UNSET)
        if same:
            index.provider_note, index.fallback_used = self.index.provider_note, self.index.fallback_used
        try:
            index.provider  # noqa: B018 - a named provider that cannot start keeps the previous configuration
        except ClawmemError as exc:
            self.log.error("reload_failed", error=str(exc), action="keeping the previous configuration")
            self.notifier.send("READY=1", "STATUS=reload failed: keeping the previous configuration")
            return
        for name, before, after in (("workspace", old.workspace, fresh.workspace),
                                    ("index", old.index_path, fresh.index_path),
                                    ("socket", old.socket_path, fresh.socket_path)):
            if before != after:
                self.log.warning("reload_ignored", setting=name, value=str(after), action="restart to change it")
        from clawmem_index.log import configure

        configure(kept.log_level)
        retired, self.index = self.index, index
        self._retired.append(retired)
        if not same:  # after the swap, so that a pass that fails on it finds the new index and goes again
            retired.release_model()  # its model process would otherwise live on beside the new one
        self.settings = kept
        if self.server is not None:
            self.server.idle_timeout = kept.daemon.idle_timeout
        if (kept.daemon, kept.extra_paths, kept.sources, kept.sessions_dir) != (
                old.daemon, old.extra_paths, old.sources, old.sessions_dir):
            if self.watcher is not None:
                self.watcher.stop()
            self.watcher = self._new_watcher(kept)
            self.watcher.start()
        self.reloads += 1
        self.log.info("reloaded", config_file=str(kept.config_file) if kept.config_file else None)
        self.writer.request_sync("reload")
        self.notifier.send("READY=1", "STATUS=configuration reloaded")

    # -- parts -------------------------------------------------------------------------------

    def _new_index(self, settings: Settings, provider: EmbeddingProvider | None = _UNSET) -> MemoryIndex:
        chosen = self._provider if provider is _UNSET else provider
        given: dict[str, Any] = {} if chosen is _UNSET else {"provider": chosen}
        return MemoryIndex(settings, pending_files=self._pending_files, files_on_disk=self._files_on_disk,
                           isolate_local_model=settings.embedding.isolate_local, long_lived=True, **given)

    def _pending_files(self) -> int:
        """Files changed since the last sync, from what the watcher and the writer know.

        Asked on every query, so it must not scan: only while a full pass is due (start-up, lost
        events, a new folder) is the answer unknown, and then one stat scan per full pass counts.
        """
        seen = self.watcher.pending() if self.watcher is not None else None
        queued = self.writer.pending()
        if seen is not None and queued is not None:
            return len(seen | queued)
        return self._scan()[1]

    def _files_on_disk(self) -> int:
        """Memory files on disk as the last full pass counted them, moved by the targeted passes since."""
        return self._on_disk if self._on_disk is not None else self._scan()[0]

    def _scan(self) -> tuple[int, int]:
        """(files on disk, changed files) by a stat scan, at most once between two full passes."""
        epoch = self.writer.counts["sync"] + self.writer.counts["reindex"]
        if self._scanned is None or self._scanned[0] != epoch:
            index = self.index
            store = index.reader() if index.backend.exists() else None
            self._scanned = (epoch, index.disk_state(store))
        return self._scanned[1]

    def _warm_chunker(self) -> None:
        """Load the tokenizer while the first edit's debounce waits: a daemon whose start-up sync had
        nothing to chunk (or chunked in worker processes) would otherwise load it inside that edit's
        sync (0.4-0.6 s); loading it at start would cost ~45 MB to a daemon that is never edited."""
        from clawmem_index.text.tokens import get_encoding

        def load() -> None:
            with contextlib.suppress(Exception):  # the sync itself reports a tokenizer that cannot load
                get_encoding(self.settings.chunking.tokenizer)

        threading.Thread(target=load, name="clawmem-warm-tokenizer", daemon=True).start()

    def _new_watcher(self, settings: Settings) -> WorkspaceWatcher:
        d = settings.daemon
        return WorkspaceWatcher(settings.workspace, self.writer.request_sync, on_first_change=self._warm_chunker,
                                extra_paths=settings.extra_paths,
                                debounce=d.debounce, max_delay=d.max_delay, rescan_interval=d.rescan_interval,
                                observer_factory=self._observer_factory, polling_factory=self._polling_factory,
                                log=self.log,
                                sessions=settings.sessions_dir if "sessions" in settings.sources else None)

    def _on_run(self, run: Run) -> None:
        report = run.report
        if run.kind != "embed":
            self._first_build.set()  # done or failed: either way waiting longer answers nothing new
            if run.error is None and not run.cancelled:
                self._first_pass = False
        if run.kind != "embed" and run.error is None and not run.cancelled:
            self.embedder.wake()  # the new chunks' vectors
            if report is not None:
                full = run.targeted is None
                base = 0 if full else (self._on_disk or 0)
                self._on_disk = (report.files_seen if full else base + report.added - report.removed)
        if run.kind == "embed" and run.error is None:
            if run.embedded:
                self.notifier.status(f"embedded {run.embedded} chunks; {run.pending_embeddings or 0} pending")
            return
        if run.error is not None:
            self.notifier.status(f"last {run.kind} failed: {run.error}")
        elif report is not None:
            self.notifier.status(f"{report.files_seen} files; last {run.kind} ({run.reason}): {report.added} added,"
                                 f" {report.updated} updated, {report.removed} removed in {run.duration:.2f}s")

    def _busy(self) -> bool:
        server = self.server
        return (server is None or server.connection_count() > 0 or self.writer.state()["running"] is not None
                or bool(self.embedder.state()["running"]))

    def _idle_exit(self) -> None:
        limit = self.settings.daemon.exit_when_idle
        self.log.info("idle_exit", idle_seconds=limit)
        self.notifier.status(f"no request for {limit:g} s: exiting (the next request starts a daemon again)")
        self.request_stop()

    def _watchdog_loop(self, interval: float) -> None:
        while not self._stopped.wait(interval):
            healthy = (self.writer.alive() and self.embedder.alive() and self.server is not None
                       and self.server.alive())
            if healthy:
                self.notifier.watchdog()
            else:
                self.log.error("unhealthy", writer=self.writer.alive(), action="withholding the watchdog ping")

    # -- Backend (what the socket serves) ----------------------------------------------------

    def _on_progress(self, done: int, total: int) -> None:
        """A first index is written in place, MEMORY.md, USER.md and the latest days first, each file committed
        as it goes: from its first file on, queries are answered from what it holds (and say it is partial)."""
        if done and self._first_pass and not self.index.rebuilding and not self._first_build.is_set():
            self._first_build.set()

    def _await_first_build(self) -> None:
        """Hold a query until a new index holds its first file, so the first answer is a real one.

        Socket activation makes this the common case: the first query is what starts the daemon.
        """
        if self._first_build.is_set():
            return
        bound = self.settings.daemon.first_build_wait
        if not self._first_build.wait(bound):
            raise IndexUnavailable(f"the daemon is still building this workspace's first index after {bound:g} s:"
                                   " try again shortly (`clawmem status` shows progress)")

    def search(self, request: SearchRequest) -> dict[str, object]:
        self._await_first_build()
        return self._partial(self.index.search(request))

    def interrupt(self, thread: int) -> None:
        """The client of the query running on `thread` has gone: end its statement (the server asks)."""
        self.index.interrupt(thread)

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, object]:
        self._await_first_build()
        return self._partial(self.index.context(request, budget))

    def _partial(self, answer: dict[str, object]) -> dict[str, object]:
        """An answer from a first index still being built says so (its `index` counts the files not in yet)."""
        if self._first_pass:
            note = FIRST_PASS_NOTE
            answer["warning"] = f"{note}; {answer['warning']}" if answer.get("warning") else note
            answer["first_pass"] = True
        return answer

    def curated(self, kind: str | None = None, limit: int = 512,
                projects: Sequence[str] | None = None) -> dict[str, object]:
        return self.index.curated(kind, limit, projects)  # the files as they are now: no index needed

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        self._await_first_build()
        return self.index.get(path, start, lines, max_bytes)

    def status(self) -> dict[str, object]:
        """The index's status from what the daemon knows: no scan, no provider call."""
        writer: dict[str, Any] = self.writer.state()
        embedder: dict[str, Any] = self.embedder.state()
        data = self.index.status(last_error=writer["last_error"])
        data["uptime"] = round(time.monotonic() - self._started_at, 1)
        queued = writer["queued"]
        running = writer["running"] or ("embed" if embedder["running"] else None)
        daemon: dict[str, Any] = {
            "pid": os.getpid(),
            "socket": str(self.socket_path),
            "socket_activated": self.socket_activated,
            "watcher": self.watcher.mode if self.watcher is not None else "stopped",
            "running": running,
            "queued": [kind for kind, wanted in queued.items() if wanted] if isinstance(queued, dict) else [],
            "runs": {**writer["runs"], "embed": embedder["runs"]["embed"]},
            "last_error": writer["last_error"],
            "embedding_error": embedder["last_error"],
            "embedding_retry_in": embedder["retry_in"],
            "embedding_progress": embedder["progress"],
            "requests_served": self.server.served if self.server is not None else 0,
            "reloads": self.reloads,
            "memory": {"rss_bytes": resident_bytes(), **self.index.backend.memory()},
        }
        model = self._model_process()
        if model is not None:
            daemon["model_process"] = model
        data["daemon"] = daemon
        reasons = data.get("stale_reasons")
        if embedder["last_error"] and isinstance(reasons, list):
            reasons.append(f"the embedding provider failed: {embedder['last_error']}")
            data["fresh"] = False
        return data

    def _model_process(self) -> dict[str, object] | None:
        """The local model's own process (pid, None until first use; restarts after it died), if it has one."""
        try:
            provider = self.index.provider
        except ClawmemError:
            return None
        from clawmem_index.embeddings.isolated import IsolatedProvider

        if not isinstance(provider, IsolatedProvider):
            return None
        return {"pid": provider.pid, "restarts": provider.restarts}

    def sync(self, wait: bool) -> dict[str, object]:
        ticket = self.writer.request_sync("client")
        if not wait:
            return {"queued": True}
        return _finished(self.writer.wait_sync(ticket))

    def reindex(self, wait: bool) -> dict[str, object]:
        ticket = self.writer.request_reindex("client")
        if not wait:
            return {"queued": True}
        return _finished(self.writer.wait_reindex(ticket))


def _finished(run: Run) -> dict[str, object]:
    if run.error is not None:
        raise run.error
    if run.cancelled:
        raise IndexUnavailable("the daemon is shutting down")
    return run.as_dict()


def _ignore_signal(signum: int, frame: object) -> None:
    """The real handling happens in the main loop, woken by the byte set_wakeup_fd writes."""


def _signal_name(number: int) -> str:
    return "stop request" if number == _STOP_BYTE else signal.Signals(number).name


def run_daemon(settings: Settings, reload_settings: Callable[[], Settings] | None = None) -> int:
    """The `clawmem serve` entry point: logging, then the daemon until a stop signal."""
    from clawmem_index.log import configure

    configure(settings.log_level)
    # watchdog warns (from its reader thread) when nested folders appear faster than it adds their
    # watches; it copes, but under `-W error` that warning would kill the thread and stop watching.
    warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)
    daemon = Daemon(settings, reload_settings=reload_settings)
    status = daemon.serve_forever()
    if daemon.abandoned:
        end_now(status)
    return status
