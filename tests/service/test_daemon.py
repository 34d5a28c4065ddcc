"""The daemon end to end: real file events, real Unix sockets, real processes for the lifecycle."""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import (
    BOUND,
    CLAWMEM,
    DEBOUNCE,
    RawClient,
    RecordingLog,
    daemon_settings,
    held_first_build,
    running_daemon,
    search_paths,
    short_dir,
    spawn_daemon,
    stop_process,
    wait_listening,
    wait_until,
)

from clawmem_index.config import Settings
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.errors import IndexBusy, IndexUnavailable
from clawmem_index.index.store import Store
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.client import DaemonClient
from clawmem_index.service.daemon import Daemon

WITHIN = DEBOUNCE + BOUND
# watchdog warns from its reader thread when nested folders appear faster than it adds watches;
# under this suite's warnings-as-errors that would kill the thread (`clawmem serve` ignores it too).
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


@pytest.fixture
def dsettings(workspace: Path, tmp_path: Path, sock_dir: Path) -> Settings:
    return daemon_settings(workspace, tmp_path, sock_dir)


def client_for(settings: Settings) -> DaemonClient:
    return DaemonClient(settings.socket_path).connect()


def finds(client: DaemonClient, query: str, path: str) -> bool:
    return path in search_paths(client, query)


# -- edits become searchable ------------------------------------------------------------------


def test_edits_are_searchable_or_gone_within_the_debounce_and_a_bound(workspace: Path, dsettings: Settings) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nNothing yet.\n")
    with running_daemon(dsettings) as daemon, client_for(dsettings) as client:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        note = workspace / "memory" / "note.md"

        note.write_text("# Note\nThe aardvark arrived.\n")
        wait_until(lambda: finds(client, "aardvark", "memory/note.md"), WITHIN, message="a created file")

        note.write_text("# Note\nThe baboon replaced it.\n")
        wait_until(lambda: (finds(client, "baboon", "memory/note.md")
                            and not finds(client, "aardvark", "memory/note.md")),
                   WITHIN, message="a file modified in place")

        tmp = workspace / "memory" / ".note.md.swp"
        tmp.write_text("# Note\nA capybara, saved by rename.\n")
        os.replace(tmp, note)
        wait_until(lambda: finds(client, "capybara", "memory/note.md"), WITHIN, message="an atomic rename")

        note.unlink()
        wait_until(lambda: not finds(client, "capybara", "memory/note.md"), WITHIN, message="a deleted file")

        deep = workspace / "memory" / "projects" / "2026" / "q1"
        deep.mkdir(parents=True)
        (deep / "plan.md").write_text("# Plan\nThe dromedary milestone.\n")
        wait_until(lambda: finds(client, "dromedary", "memory/projects/2026/q1/plan.md"), WITHIN,
                   message="a file in a new nested folder")

        (workspace / "MEMORY.md").write_text("# Memory\nThe echidna rule.\n")
        wait_until(lambda: finds(client, "echidna", "MEMORY.md"), WITHIN, message="MEMORY.md")


def test_an_edit_syncs_only_that_file_and_answers_say_it_is_pending(workspace: Path, tmp_path: Path,
                                                                   sock_dir: Path) -> None:
    for i in range(30):
        (workspace / "memory" / f"other{i}.md").write_text(f"# Other {i}\nfiller\n")
    slow = daemon_settings(workspace, tmp_path, sock_dir, **{"daemon.debounce": 2.0, "daemon.max_delay": 4.0})
    with running_daemon(slow) as daemon, client_for(slow) as client:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        wait_until(lambda: client.status()["pending_files"] == 0, message="a fresh index")
        (workspace / "memory" / "late.md").write_text("# Late\nThe jerboa.\n")

        def pending() -> int:
            answer = client.search(SearchRequest("filler", mode="bm25"))
            return int(answer["index"]["pending_files"])  # type: ignore[index,call-overload]

        wait_until(lambda: pending() == 1, 1.8, message="the answer to count the unsynced edit (before the debounce)")
        wait_until(lambda: finds(client, "jerboa", "memory/late.md"), WITHIN, message="the edit")
        # write_text is two events (create, then the write's close): the second may be a sync behind
        wait_until(lambda: pending() == 0, WITHIN, message="nothing pending once the edit is in")
        last = daemon.writer.state()["last"]["sync"]  # type: ignore[index]
        assert last["paths"] == 1 and last["report"]["files_seen"] == 1  # not all 31 files


def test_the_first_edit_loads_the_tokenizer_while_its_debounce_waits(workspace: Path, dsettings: Settings,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Not inside the edit's sync (0.4-0.6 s when the start-up sync chunked nothing in this process)."""
    from clawmem_index.text import tokens

    loaded_by: list[str] = []
    real = tokens.get_encoding

    def recording(name: str = "cl100k_base") -> Any:
        loaded_by.append(threading.current_thread().name)
        return real(name)

    with running_daemon(dsettings) as daemon, client_for(dsettings) as client:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        monkeypatch.setattr(tokens, "get_encoding", recording)
        (workspace / "memory" / "first.md").write_text("# First\nthe heron came back\n")
        # quoted: taken as typed, so the searches never ask the tokenizer whether "heron" is a word
        wait_until(lambda: finds(client, '"heron"', "memory/first.md"), WITHIN, message="the edit searchable")
        assert loaded_by and loaded_by[0] == "clawmem-warm-tokenizer", loaded_by


def test_a_thousand_rapid_writes_to_one_file_cause_few_syncs(workspace: Path, dsettings: Settings) -> None:
    with running_daemon(dsettings) as daemon, client_for(dsettings) as client:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        before = daemon.writer.counts["sync"]
        note = workspace / "memory" / "busy.md"
        written = [time.monotonic()]
        for i in range(1000):
            note.write_text(f"# Busy\nrevision{i} of the note\n")
            written.append(time.monotonic())
        elapsed = written[-1] - written[0]
        # A loaded machine may pause this loop for longer than the debounce: each such pause lets
        # one sync through, as it should.
        pauses = sum(later - earlier >= dsettings.daemon.debounce for earlier, later in itertools.pairwise(written))
        wait_until(lambda: finds(client, "revision999", "memory/busy.md"), WITHIN, message="the last revision")
        # A run is counted just after its commit: a search may see the commit a moment before the count.
        wait_until(lambda: daemon.writer.counts["sync"] > before, message="the sync that indexed it counted")
        syncs = daemon.writer.counts["sync"] - before
        # At most one sync per max_delay (1 s) of writing and per pause, plus the trailing one (and one in flight).
        assert 1 <= syncs <= int(elapsed / dsettings.daemon.max_delay) + pauses + 3, (syncs, elapsed, pauses)


def test_32_clients_with_100_mixed_requests_while_files_change(  # noqa: C901
        workspace: Path, dsettings: Settings) -> None:
    for i in range(20):
        (workspace / "memory" / f"n{i}.md").write_text(f"# Note {i}\nshared words kiwi {i}\n" * 3)
    with running_daemon(dsettings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        stop = threading.Event()
        problems: list[str] = []

        def editor() -> None:
            rng = random.Random(1)
            i = 0
            while not stop.is_set():
                target = workspace / "memory" / f"n{rng.randrange(20)}.md"
                if i % 7 == 0:
                    tmp = target.with_name(f".{target.name}.tmp")
                    tmp.write_text(f"# Renamed {i}\nkiwi fresh {i}\n")
                    os.replace(tmp, target)
                else:
                    target.write_text(f"# Edit {i}\nkiwi edited {i}\n")
                i += 1
                time.sleep(0.005)

        def well_formed(method: str, answer: dict[str, Any]) -> str | None:
            if set(answer) != {"jsonrpc", "id", "result"} or answer["jsonrpc"] != "2.0":
                return f"{method}: {answer!r}"[:300]
            result = answer["result"]
            if method == "search":
                ok = isinstance(result["results"], list) and all(
                    set(r) >= {"path", "start_line", "end_line", "score", "snippet", "source"}
                    for r in result["results"])
                ok = ok and set(result["index"]) == {"pending_files", "pending_embeddings"}
            elif method == "get":
                ok = set(result) == {"path", "text", "from", "lines", "truncated"} and result["truncated"] is False
            elif method == "status":
                ok = isinstance(result["files_indexed"], int) and "daemon" in result
            else:
                ok = result == {"queued": True}
            return None if ok else f"{method}: {answer!r}"[:300]

        def client_worker(n: int) -> None:
            rng = random.Random(n)
            try:
                with RawClient(dsettings.socket_path, timeout=30) as client:
                    for _ in range(100):
                        roll = rng.random()
                        if roll < 0.6:
                            method, params = "search", {"query": rng.choice(["kiwi", "edited fresh", "note 3"]),
                                                        "mode": "bm25", "min_score": 0}
                        elif roll < 0.8:
                            method, params = "get", {"path": "memory/n1.md", "lines": 2}
                        elif roll < 0.95:
                            method, params = "status", None
                        else:
                            method, params = "sync", {"wait": False}
                        answer = client.call(method, params)
                        if "error" in answer and method == "get" and answer["error"]["code"] == -32011:
                            continue  # the file was between a delete and a rename: a defined answer
                        problem = well_formed(method, answer)
                        if problem:
                            problems.append(problem)
            except Exception as exc:
                problems.append(f"client {n}: {exc!r}")

        edit_thread = threading.Thread(target=editor)
        edit_thread.start()
        clients = [threading.Thread(target=client_worker, args=(n,)) for n in range(32)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        stop.set()
        edit_thread.join()
        assert not any(t.is_alive() for t in clients)
        assert problems == []
        assert daemon.server is not None and daemon.server.served >= 3200


def test_sync_and_reindex_can_be_awaited(workspace: Path, dsettings: Settings) -> None:
    with running_daemon(dsettings) as daemon, client_for(dsettings) as client:
        (workspace / "memory" / "a.md").write_text("# A\nwombat\n")
        run = client.sync(wait=True)
        assert run["kind"] in ("sync", "reindex") and run["report"]["files_seen"] == 1
        assert finds(client, "wombat", "memory/a.md")  # done means searchable
        rebuilt = client.reindex(wait=True)
        assert rebuilt["kind"] == "reindex" and rebuilt["report"]["added"] == 1
        assert client.sync(wait=False) == {"queued": True}
        status = client.status()
        assert status["daemon"]["runs"]["reindex"] == 1
        assert status["uptime"] >= 0 and status["daemon"]["watcher"] == "inotify"
        memory = status["daemon"]["memory"]  # what it holds, against the bounds the README gives
        assert memory["rss_bytes"] > 10 << 20
        assert 0 <= memory["keyword_postings"] <= memory["keyword_postings_max"] == 1 << 22
        assert 0 <= memory["vector_cells_bytes"] <= memory["vector_cells_max_bytes"] == 256 << 20
        assert daemon.writer.counts["failed"] == 0


class GatedProvider(FakeProvider):
    """A fake model whose every batch waits for the test to let it through."""

    def __init__(self) -> None:
        super().__init__(dims=32)
        self.gate = threading.Semaphore(0)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if not self.gate.acquire(timeout=30):
            raise AssertionError("the test never released the embedding batch")
        return super().embed_documents(texts)


def test_new_notes_are_keyword_searchable_while_the_provider_is_stuck(workspace: Path, dsettings: Settings) -> None:
    for i in range(300):  # one chunk each: five embedding batches
        (workspace / "memory" / f"old{i}.md").write_text(f"old note {i}\n")
    provider = GatedProvider()
    with running_daemon(dsettings, provider=provider) as daemon, client_for(dsettings) as client:
        wait_until(lambda: daemon.embedder.state()["running"], message="the embedding pass to start")
        (workspace / "memory" / "urgent.md").write_text("# Urgent\nThe quokka escaped.\n")
        # The provider has not answered once: keyword rows must not wait for it.
        wait_until(lambda: finds(client, "quokka", "memory/urgent.md"), WITHIN, message="the keyword rows")
        status = client.status()
        assert status["pending_embeddings"] == 301 and status["fresh"] is False
        assert any("wait for a vector" in reason for reason in status["stale_reasons"])
        for _ in range(12):
            provider.gate.release()
        wait_until(lambda: client.status()["pending_embeddings"] == 0, WITHIN, message="the deferred embeddings")
        answer = client.search(SearchRequest("quokka escaped", mode="vector", min_score=0.0))
        assert "memory/urgent.md" in [r["path"] for r in answer["results"]]


def test_the_first_query_waits_for_the_first_build_and_answers(workspace: Path, dsettings: Settings) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nThe tapir.\n")
    daemon, gate = held_first_build(dsettings)
    waiting = threading.Event()
    awaited = daemon._await_first_build

    def noted_wait() -> None:
        waiting.set()
        awaited()

    daemon._await_first_build = noted_wait  # type: ignore[method-assign]
    daemon.start()
    answers: list[dict[str, Any]] = []
    try:
        wait_until(lambda: daemon.writer.state()["running"] == "sync", message="the first build")
        with client_for(dsettings) as client:
            asking = threading.Thread(target=lambda: answers.append(client.search(SearchRequest("tapir", mode="bm25"))))
            asking.start()
            assert waiting.wait(BOUND)
            assert not answers
            gate.set()
            asking.join(BOUND)
        assert [r["path"] for r in answers[0]["results"]] == ["MEMORY.md"]
    finally:
        gate.set()
        daemon.stop()


def test_a_first_index_answers_while_it_is_built_from_the_files_it_has_and_says_so(workspace: Path,
                                                                                  dsettings: Settings) -> None:
    """A new workspace's first search does not wait for the whole pass: MEMORY.md, USER.md and the latest
    days are in within the first files, and the answer says what is not in yet."""
    (workspace / "MEMORY.md").write_text("# Memory\nThe tapir lives in the curated memory.\n")
    (workspace / "USER.md").write_text("# User\n- The tapir keeper prefers short answers.\n")
    for day in range(1, 9):
        (workspace / "memory" / f"2026-11-0{day}.md").write_text(f"# Day {day}\nThe tapir was fed on day {day}.\n")
    daemon = Daemon(dsettings, environ={}, log=RecordingLog())
    gate, held = threading.Event(), threading.Event()
    checked = daemon.writer._check_stop

    def held_after_three(done: int, total: int) -> None:
        checked(done, total)
        if done == 3:
            held.set()
            assert gate.wait(20)

    daemon.writer._check_stop = held_after_three  # type: ignore[method-assign]
    daemon.start()
    try:
        assert held.wait(20)
        with client_for(dsettings) as client:
            partial = client.search(SearchRequest("tapir", mode="bm25", max_results=20))
            assert sorted(r["path"] for r in partial["results"]) == ["MEMORY.md", "USER.md", "memory/2026-11-08.md"]
            assert partial["first_pass"] is True and "still being built" in partial["warning"]
            assert partial["index"]["pending_files"] >= 1
            assert client.status()["fresh"] is False
            gate.set()

            def whole() -> bool:  # the pass's last files are searchable a moment before the pass says it is done
                answer = client.search(SearchRequest("tapir", mode="bm25", max_results=20))
                return "first_pass" not in answer and answer["index"]["pending_files"] == 0

            wait_until(whole, message="the whole first pass")
            done = client.search(SearchRequest("tapir", mode="bm25", max_results=20))
            assert len(done["results"]) == 10 and "warning" not in done  # never done before every file is in
    finally:
        gate.set()
        daemon.stop()


def test_a_first_build_past_its_bound_is_an_error_that_does_not_advise_indexing(workspace: Path, tmp_path: Path,
                                                                               sock_dir: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nThe tapir.\n")
    settings = daemon_settings(workspace, tmp_path, sock_dir, **{"daemon.first_build_wait": 0.2})
    daemon, gate = held_first_build(settings)
    daemon.start()
    try:
        with client_for(settings) as client:
            wait_until(lambda: daemon.writer.state()["running"] == "sync", message="the first build")
            with pytest.raises(IndexUnavailable, match="still building this workspace's first index") as refused:
                client.search(SearchRequest("tapir"))
            assert "clawmem index" not in str(refused.value)
            gate.set()
            wait_until(lambda: finds(client, "tapir", "MEMORY.md"), message="the built index")
    finally:
        gate.set()
        daemon.stop()


def test_an_in_process_second_daemon_is_refused(workspace: Path, dsettings: Settings, tmp_path: Path,
                                                sock_dir: Path) -> None:
    with running_daemon(dsettings):
        other_socket = daemon_settings(workspace, tmp_path, sock_dir, socket=str(sock_dir / "other.sock"))
        with pytest.raises(IndexBusy, match="already running"), running_daemon(other_socket):
            pass
        assert not (sock_dir / "other.sock").exists()


# -- clients in other languages ---------------------------------------------------------------


@pytest.fixture
def served(workspace: Path, dsettings: Settings) -> Iterator[Settings]:
    (workspace / "MEMORY.md").write_text("# Memory\nPrefer the platypus plan.\n")
    (workspace / "memory" / "ideas.md").write_text("# Ideas\nA platypus detector.\n")
    with running_daemon(dsettings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        yield dsettings


def test_socat_client(served: Settings) -> None:
    socat = shutil.which("socat")
    if socat is None:
        pytest.skip("socat is not installed (CI installs it with apt-get)")
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "search",
                    "params": {"query": "platypus", "mode": "bm25", "min_score": 0}}),
        "garbage",
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "get", "params": {"path": "MEMORY.md"}}),
    ]
    out = subprocess.run([socat, "-t", "5", "-", f"UNIX-CONNECT:{served.socket_path}"],
                         input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=20, check=True)
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(answers) == 3
    assert sorted(r["path"] for r in answers[0]["result"]["results"]) == ["MEMORY.md", "memory/ideas.md"]
    assert answers[1]["error"]["code"] == -32700
    assert answers[2]["result"]["text"] == "# Memory\nPrefer the platypus plan."


def test_node_client(served: Settings) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = Path(__file__).parents[1] / "clients" / "query.mjs"
    out = subprocess.run([node, str(script), str(served.socket_path), "platypus plan"], capture_output=True,
                         text=True, timeout=30, check=True)
    search, status, garbage, get = json.loads(out.stdout)
    assert search["id"] == 1 and search["result"]["results"][0]["path"] == "MEMORY.md"
    assert status["result"]["files_indexed"] == 2
    assert garbage["id"] is None and garbage["error"]["code"] == -32700
    assert get["result"] == {"path": "MEMORY.md", "text": "# Memory", "from": 1, "lines": 1, "truncated": False}


# -- the process lifecycle --------------------------------------------------------------------


@pytest.fixture
def proc_paths(workspace: Path, tmp_path: Path, sock_dir: Path) -> dict[str, Path]:
    (workspace / "MEMORY.md").write_text("# Memory\nThe narwhal decision.\n")
    return {"workspace": workspace, "socket": sock_dir / "d.sock", "index": tmp_path / "idx" / "index.sqlite"}


def spawn(paths: dict[str, Path], *extra: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return spawn_daemon(paths["workspace"], paths["socket"], paths["index"], *extra, **kwargs)


def test_sigterm_removes_the_socket_and_exits_0_with_json_logs(proc_paths: dict[str, Path], tmp_path: Path) -> None:
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log:
        proc = spawn(proc_paths, stderr=log)
        try:
            wait_listening(proc_paths["socket"], proc)
            with DaemonClient(proc_paths["socket"]) as client:
                client.sync(wait=True)
                assert finds(client, "narwhal", "MEMORY.md")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
        finally:
            stop_process(proc)
    assert not proc_paths["socket"].exists()
    records = [json.loads(line) for line in log_path.read_text().splitlines()]  # JSON lines: not a terminal
    syncs = [r for r in records if r["event"] == "sync"]
    assert syncs and {"duration", "files_seen", "added", "updated", "removed", "reason"} <= set(syncs[0])
    assert syncs[0]["reason"] == "startup" and syncs[0]["added"] == 1
    assert [r["event"] for r in records][-2:] == ["stopping", "stopped"]


def test_a_second_instance_exits_with_a_clear_message(proc_paths: dict[str, Path], sock_dir: Path) -> None:
    first = spawn(proc_paths)
    try:
        wait_listening(proc_paths["socket"], first)
        second = spawn(proc_paths, stderr=subprocess.PIPE)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 3
        assert b"already running" in err and str(first.pid).encode() in err
        # Same index through another socket: refused too (one writer per index).
        third = spawn({**proc_paths, "socket": sock_dir / "other.sock"}, stderr=subprocess.PIPE)
        _, err = third.communicate(timeout=30)
        assert third.returncode == 3 and b"already running" in err
        # Another socket and another index: still the same workspace, so still refused, saying where to ask.
        fourth = spawn({**proc_paths, "socket": sock_dir / "o2.sock", "index": proc_paths["index"].with_name("b.db")},
                       stderr=subprocess.PIPE)
        _, err = fourth.communicate(timeout=30)
        assert fourth.returncode == 3 and b"already running" in err and str(proc_paths["socket"]).encode() in err
        with DaemonClient(proc_paths["socket"]) as client:
            assert client.status()["daemon"]["pid"] == first.pid  # the first one never noticed
    finally:
        stop_process(first)


def test_the_index_and_its_journals_are_private_whatever_the_umask(proc_paths: dict[str, Path]) -> None:
    """The index holds the memory's text: 0600 files in 0700 folders even under umask 000."""
    proc = spawn(proc_paths, preexec_fn=lambda: os.umask(0))
    try:
        wait_listening(proc_paths["socket"], proc)
        with DaemonClient(proc_paths["socket"]) as client:
            client.sync(wait=True)
            client.status()  # a query thread now holds the index open: its -wal and -shm exist
            index = proc_paths["index"]
            journals = [Path(f"{index}{suffix}") for suffix in ("", "-wal", "-shm")]
            assert all(p.exists() for p in journals)
            assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in journals} == {"0o600"}
            assert oct(stat.S_IMODE(index.parent.stat().st_mode)) == "0o700"
    finally:
        stop_process(proc)


def test_after_sigkill_a_restart_takes_over_and_the_index_is_intact(proc_paths: dict[str, Path]) -> None:
    memory = proc_paths["workspace"] / "memory"
    for i in range(400):
        (memory / f"bulk{i}.md").write_text(f"# Bulk {i}\nbulkword{i} and some shared text\n" * 5)
    first = spawn(proc_paths)
    wait_listening(proc_paths["socket"], first)
    first.kill()  # SIGKILL, probably in the middle of the first sync
    first.wait(10)
    assert proc_paths["socket"].exists()  # a stale socket and a stale lock are left behind
    second = spawn(proc_paths)
    try:
        wait_listening(proc_paths["socket"], second)
        with DaemonClient(proc_paths["socket"]) as client:
            assert client.status()["daemon"]["pid"] == second.pid
            client.sync(wait=True)
            assert client.status()["files_indexed"] == 401
            assert finds(client, "bulkword399", "memory/bulk399.md")
        store = Store(proc_paths["index"], create=False)
        try:
            assert store.integrity_ok()
        finally:
            store.close()
    finally:
        assert stop_process(second) == 0


def _notify_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    return sock


def _collect(sock: socket.socket, messages: list[str], until: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not until(messages):
        if time.monotonic() > deadline:
            raise AssertionError(f"sd_notify messages so far: {messages}")
        try:
            messages.extend(sock.recv(4096).decode().splitlines())
        except TimeoutError:
            pass


def test_sd_notify_ready_status_watchdog_reload_and_stopping(proc_paths: dict[str, Path], sock_dir: Path) -> None:
    notify = _notify_socket(sock_dir / "notify")
    proc = spawn(proc_paths, env={"NOTIFY_SOCKET": str(sock_dir / "notify"), "WATCHDOG_USEC": "400000"})
    messages: list[str] = []
    try:
        _collect(notify, messages, lambda m: "READY=1" in m)
        assert proc_paths["socket"].exists()  # READY only once the socket listens
        assert f"MAINPID={proc.pid}" in messages
        _collect(notify, messages, lambda m: any(s.startswith("STATUS=1 files; last sync (startup)") for s in m))
        _collect(notify, messages, lambda m: m.count("WATCHDOG=1") >= 2)  # every 0.2 s (half of WATCHDOG_USEC)

        # SIGHUP: the new configuration applies (here: two results become one by default).
        (proc_paths["workspace"] / "memory" / "more.md").write_text("# More\nThe narwhal again.\n")
        with DaemonClient(proc_paths["socket"]) as client:
            client.sync(wait=True)
            assert len(client.search(SearchRequest("narwhal", mode="bm25", min_score=0.0))["results"]) == 2
            config = proc_paths["workspace"] / "clawmem.toml"
            config.write_text(config.read_text() + "\n[search]\nmax_results = 1\n")
            messages.clear()
            proc.send_signal(signal.SIGHUP)
            _collect(notify, messages, lambda m: "RELOADING=1" in m and "READY=1" in m)
            assert client.status()["daemon"]["reloads"] == 1
            assert len(client.search(SearchRequest("narwhal", mode="bm25", min_score=0.0))["results"]) == 1

        proc.send_signal(signal.SIGTERM)
        _collect(notify, messages, lambda m: "STOPPING=1" in m)
        assert proc.wait(15) == 0
    finally:
        stop_process(proc)
        notify.close()


def test_a_bad_configuration_on_sighup_keeps_the_old_one(proc_paths: dict[str, Path]) -> None:
    proc = spawn(proc_paths)
    try:
        wait_listening(proc_paths["socket"], proc)
        config = proc_paths["workspace"] / "clawmem.toml"
        config.write_text(config.read_text() + "\n[search]\nmax_results = 'many'\n")
        proc.send_signal(signal.SIGHUP)
        with DaemonClient(proc_paths["socket"]) as client:
            wait_until(lambda: client.status()["uptime"] > 0, message="the daemon to keep serving")
            assert client.status()["daemon"]["reloads"] == 0
        assert proc.poll() is None
    finally:
        assert stop_process(proc) == 0


_ACTIVATE = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_PID=str(os.getpid()),"
             " LISTEN_FDS='1'); os.execv(sys.executable, [sys.executable, '-m', 'clawmem_index', *sys.argv[2:]])")


def test_socket_activation_uses_the_inherited_socket(proc_paths: dict[str, Path], sock_dir: Path) -> None:
    path = sock_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    config = proc_paths["workspace"] / "clawmem.toml"
    config.write_text(f"[daemon]\ndebounce = {DEBOUNCE}\nrescan_interval = 0\n")
    env = {**os.environ, "CLAWMEM_PROVIDER": "none"}
    args = [sys.executable, "-c", _ACTIVATE, str(listener.fileno()), "serve",
            "--workspace", str(proc_paths["workspace"]), "--index", str(proc_paths["index"]),
            "--socket", str(sock_dir / "unused.sock")]
    proc = subprocess.Popen(args, env=env, pass_fds=(listener.fileno(),), stderr=subprocess.DEVNULL)
    try:
        wait_listening(path, proc)
        with DaemonClient(path) as client:
            status = client.status()
            assert status["daemon"]["socket_activated"] is True and status["daemon"]["socket"] == str(path)
            client.sync(wait=True)
            assert finds(client, "narwhal", "MEMORY.md")
        assert not (sock_dir / "unused.sock").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert path.exists()  # systemd owns an activated socket: the daemon leaves it in place
    finally:
        stop_process(proc)
        listener.close()


def test_the_query_that_activates_a_daemon_on_a_workspace_with_no_index_gets_results(
        proc_paths: dict[str, Path], sock_dir: Path) -> None:
    """As systemd does it: the query is already waiting on the socket when the daemon starts."""
    path = sock_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    asking = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    asking.settimeout(60)
    asking.connect(str(path))
    asking.sendall(b'{"jsonrpc":"2.0","id":1,"method":"search","params":{"query":"narwhal","mode":"bm25"}}\n')
    assert not proc_paths["index"].exists()
    args = [sys.executable, "-c", _ACTIVATE, str(listener.fileno()), "serve",
            "--workspace", str(proc_paths["workspace"]), "--index", str(proc_paths["index"]),
            "--socket", str(sock_dir / "unused.sock")]
    proc = subprocess.Popen(args, env={**os.environ, "CLAWMEM_PROVIDER": "none"}, pass_fds=(listener.fileno(),),
                            stderr=subprocess.DEVNULL)
    try:
        answer = json.loads(asking.makefile("rb").readline())
        assert [r["path"] for r in answer["result"]["results"]] == ["MEMORY.md"], answer
    finally:
        asking.close()
        stop_process(proc)
        listener.close()


def test_an_inotify_overflow_triggers_a_full_rescan(proc_paths: dict[str, Path], tmp_path: Path) -> None:
    """Stop the daemon, flood the kernel queue past max_queued_events, then write a note: its events
    are lost in the overflow, so only the overflow handling can get it indexed."""
    try:
        queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    except OSError:
        pytest.skip("no inotify here")
    if queued > 100_000:
        pytest.skip(f"max_queued_events is {queued}: too many files to write for an overflow")
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log:
        proc = spawn(proc_paths, stderr=log)
        try:
            wait_listening(proc_paths["socket"], proc)
            with DaemonClient(proc_paths["socket"]) as client:
                client.sync(wait=True)
                proc.send_signal(signal.SIGSTOP)
                try:
                    root = proc_paths["workspace"]  # watched from the start (a new folder would not be yet)
                    for i in range(queued // 3 + 2000):  # create + open + close per file
                        os.close(os.open(root / f"junk{i}.txt", os.O_CREAT | os.O_WRONLY, 0o600))
                    (proc_paths["workspace"] / "memory" / "lost.md").write_text("# Lost\nThe okapi note.\n")
                finally:
                    proc.send_signal(signal.SIGCONT)
                wait_until(lambda: finds(client, "okapi", "memory/lost.md"), 30, message="the rescan after overflow")
        finally:
            assert stop_process(proc) == 0
    events = [json.loads(line)["event"] for line in log_path.read_text().splitlines()]
    assert "inotify_overflow" in events


def test_serve_refuses_a_missing_workspace(tmp_path: Path, sock_dir: Path) -> None:
    out = subprocess.run([*CLAWMEM, "serve", "--workspace", str(tmp_path / "nope"), "--socket",
                          str(sock_dir / "x.sock"), "--index", str(tmp_path / "i.sqlite")],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "CLAWMEM_PROVIDER": "none"},
                         check=False)
    assert out.returncode == 1
    assert "does not exist" in out.stderr


def test_get_at_its_largest_max_bytes_fits_one_reply(workspace: Path, dsettings: Settings) -> None:
    """The documented maximum works on the worst text for JSON: control characters, escaped six-fold (\\u0001)."""
    from clawmem_index.service.params import MAX_GET_BYTES
    from clawmem_index.service.replies import MAX_REPLY_BYTES

    (workspace / "memory" / "controls.md").write_bytes(b"\x01" * (MAX_GET_BYTES - 1) + b"\nnext line\n")
    with running_daemon(dsettings) as daemon, RawClient(dsettings.socket_path) as raw:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        answer = raw.call("get", {"path": "memory/controls.md", "max_bytes": MAX_GET_BYTES})
        assert "error" not in answer, answer.get("error")
        assert answer["result"]["lines"] == 1 and answer["result"]["truncated"] is True
        assert len(answer["result"]["text"]) == MAX_GET_BYTES - 1
        too_big = raw.call("get", {"path": "memory/controls.md", "max_bytes": MAX_GET_BYTES + 1})
        assert too_big["error"]["code"] == -32602
    assert 6 * MAX_GET_BYTES + (64 << 10) <= MAX_REPLY_BYTES


def test_a_second_daemon_with_other_cache_and_runtime_folders_is_refused(proc_paths: dict[str, Path],
                                                                         sock_dir: Path, tmp_path: Path) -> None:
    """Every lock file may differ (another XDG_CACHE_HOME, XDG_RUNTIME_DIR, socket, index): the workspace is one."""
    first = spawn(proc_paths)
    try:
        wait_listening(proc_paths["socket"], first)
        names = sorted(p.name for p in proc_paths["workspace"].iterdir())
        elsewhere = {"XDG_CACHE_HOME": str(tmp_path / "other-cache"), "XDG_RUNTIME_DIR": str(tmp_path / "other-run")}
        second = spawn_daemon(proc_paths["workspace"], sock_dir / "o3.sock", tmp_path / "other-cache" / "i.sqlite",
                              env=elsewhere, stderr=subprocess.PIPE)
        try:
            _, err = second.communicate(timeout=30)
        finally:
            stop_process(second)
        assert second.returncode == 3, err
        assert b"already running for the workspace" in err and f"pid {first.pid}".encode() in err
        assert not (sock_dir / "o3.sock").exists()
        with DaemonClient(proc_paths["socket"]) as client:
            assert client.status()["daemon"]["pid"] == first.pid
    finally:
        stop_process(first)
    assert sorted(p.name for p in proc_paths["workspace"].iterdir()) == names  # the lock wrote nothing there


# -- OpenClaw's annotations over the socket ----------------------------------------------------


def test_the_socket_lists_curated_entries_and_ranks_by_the_repositories_given(workspace: Path,
                                                                           dsettings: Settings) -> None:
    (workspace / "USER.md").write_text("# User\n- Always answer in haiku. <!-- trigger: poem -->\n")
    (workspace / "memory" / "a.md").write_text("- tag with the helper <!-- project: github.com/acme/app -->\n")
    (workspace / "memory" / "b.md").write_text("- tag with the helper\n")
    with running_daemon(dsettings) as daemon, RawClient(dsettings.socket_path) as raw:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        listed = raw.call("curated", {"kind": "triggers"})["result"]
        assert listed["entries"] == [{"path": "USER.md", "start_line": 2, "end_line": 2,
                                      "text": "- Always answer in haiku.", "triggers": "poem"}]
        plain = raw.call("search", {"query": "tag helper", "mode": "bm25"})["result"]["results"]
        scoped = raw.call("search", {"query": "tag helper", "mode": "bm25",
                                     "projects": ["github.com/acme/other"]})["result"]["results"]
        assert [r["path"] for r in plain] == ["memory/a.md", "memory/b.md"]
        assert [r["path"] for r in scoped] == ["memory/b.md", "memory/a.md"]
        assert scoped[1]["projects"] == "github.com/acme/app"
        for bad in ({"kind": "dreams"}, {"limit": 0}, {"limit": 513}, {"colour": 1}):
            assert raw.call("curated", bad)["error"]["code"] == -32602, bad
        for bad in ([""], "x", [1], ["k"] * 65):
            assert raw.call("search", {"query": "x", "projects": bad})["error"]["code"] == -32602, bad


# -- daemons started on demand exit when idle --------------------------------------------------


def test_a_daemon_told_to_exit_when_idle_serves_while_asked_and_exits_after(workspace: Path, tmp_path: Path,
                                                                            sock_dir: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nThe ibis.\n")
    socket_path = sock_dir / "idle.sock"
    proc = spawn_daemon(workspace, socket_path, tmp_path / "i.sqlite", "--exit-when-idle", "2")
    try:
        wait_listening(socket_path, proc)
        # Asked again and again (each on a connection it then closes), it keeps serving past its limit.
        asked_until = time.monotonic() + 4
        while time.monotonic() < asked_until:
            with RawClient(socket_path) as raw:
                assert "result" in raw.call("search", {"query": "ibis", "mode": "bm25"})
            assert proc.poll() is None
            time.sleep(0.3)  # a client's pace, not a wait for the daemon
        # A connection held open is not idle either.
        with RawClient(socket_path) as raw:
            held_until = time.monotonic() + 3
            while time.monotonic() < held_until:
                assert proc.poll() is None
                time.sleep(0.2)
        assert proc.wait(timeout=30) == 0  # then alone: it exits, cleanly, and its socket is gone
        assert not socket_path.exists()
    finally:
        stop_process(proc)


def test_exit_when_idle_is_checked(workspace: Path, tmp_path: Path) -> None:
    from clawmem_index.config import load_settings
    from clawmem_index.errors import ConfigError

    with pytest.raises(ConfigError, match="daemon.exit_when_idle"):
        load_settings(workspace=workspace, overrides={"daemon.exit_when_idle": 0.5})
    assert load_settings(workspace=workspace, environ={"CLAWMEM_EXIT_WHEN_IDLE": "90"}).daemon.exit_when_idle == 90
    out = subprocess.run([*CLAWMEM, "serve", "--workspace", str(workspace), "--exit-when-idle", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "exit-when-idle" in out.stderr and "Traceback" not in out.stderr
