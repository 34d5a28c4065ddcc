"""`clawmem mcp` through the official MCP SDK's own clients: stdio and Streamable HTTP, with and without a daemon."""

from __future__ import annotations

import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from daemon_helpers import daemon_settings, running_daemon, short_dir, stop_process, wait_until
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from clawmem_index.api import Client
from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.mcp.server import TOOLS, call_tool

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

STARTUP = 60.0


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


@pytest.fixture
def indexed(workspace: Path, settings: Settings) -> Settings:
    (workspace / "MEMORY.md").write_text("# Memory\n\n- Dana likes one file and no server.\n")
    (workspace / "memory" / "2026-11-22.md").write_text(
        "# 2026-11-22\n\n## Decisions\n- Why sqlite: the index is a disposable cache.\n- Dana agreed.\n")
    index = MemoryIndex(settings)
    index.sync()
    index.close()
    return settings


def server_args(settings: Settings, socket_path: Path, *extra: str) -> list[str]:
    return ["-m", "clawmem_index", "mcp", "--workspace", str(settings.workspace), "--index", str(settings.index_path),
            "--socket", str(socket_path), *extra]


def server_env() -> dict[str, str]:
    return {**os.environ, "CLAWMEM_PROVIDER": "none"}


async def exercise(read: Any, write: Any) -> dict[str, Any]:
    """Everything a host does: handshake, list, and one call of each tool (and two that must fail)."""
    async with ClientSession(read, write) as session:
        seen: dict[str, Any] = {"init": await session.initialize(), "tools": (await session.list_tools()).tools}
        calls = {
            "search": ("memory_search", {"query": "why sqlite", "maxResults": 3}),
            "dana": ("memory_search", {"query": "Dana"}),
            "dana_floor": ("memory_search", {"query": "Dana", "minScore": 0.99}),
            "get": ("memory_get", {"path": "memory/2026-11-22.md", "from": 3, "lines": 2}),
            "status": ("memory_status", {}),
            "context": ("memory_context", {"query": "why sqlite", "budget": 60}),
            "dated": ("memory_search", {"query": "sqlite yesterday", "now": "2026-11-23"}),
            "dated_context": ("memory_context", {"query": "sqlite yesterday", "now": "2026-11-23", "budget": 60}),
            "refused": ("memory_get", {"path": "../etc/passwd"}),
            "empty": ("memory_search", {"query": ""}),
            "bad_number": ("memory_search", {"query": "sqlite", "maxResults": "many"}),
        }
        for key, (name, arguments) in calls.items():
            seen[key] = await session.call_tool(name, arguments)
        return seen


def check(seen: dict[str, Any], served_by: str) -> None:
    assert seen["init"].server_info.name == "clawmem"
    assert "memory_search" in (seen["init"].instructions or "")
    tools = {t.name: t for t in seen["tools"]}
    assert list(tools) == ["memory_search", "memory_get", "memory_status", "memory_context"]
    assert set(tools["memory_search"].input_schema["properties"]) == {"query", "maxResults", "minScore", "explain",
                                                                      "workspaces", "now"}
    for name in ("memory_search", "memory_context"):
        assert tools[name].input_schema["properties"]["workspaces"] == {
            "type": "array", "items": {"type": "string"}, "maxItems": 64,
            "description": "Shared index only: the workspaces to search (names); each result then names its workspace."}
    assert tools["memory_search"].input_schema["required"] == ["query"]  # OpenClaw's, plus an optional explain
    assert set(tools["memory_get"].input_schema["properties"]) == {"path", "from", "lines"}
    assert "before answering" in (tools["memory_search"].description or "")

    search = seen["search"]
    assert not search.is_error
    data = search.structured_content
    assert {"results", "provider", "model", "mode", "index"} <= data.keys()
    assert data["index"].keys() == {"pending_files", "pending_embeddings"}
    top = data["results"][0]
    assert top.keys() >= {"path", "startLine", "endLine", "score", "snippet", "source", "citation"}
    assert top["path"] == "memory/2026-11-22.md" and top["citation"] == f"memory/2026-11-22.md#L1-L{top['endLine']}"
    assert '"citation":"memory/2026-11-22.md#L1-L' in search.content[0].text, "the model reads the same JSON"
    assert len(seen["dana"].structured_content["results"]) == 2
    assert len(seen["dana_floor"].structured_content["results"]) == 1, "minScore reaches the search"

    get = seen["get"]
    assert not get.is_error
    assert get.structured_content == {"path": "memory/2026-11-22.md", "text": "## Decisions\n- Why sqlite: the index"
                                      " is a disposable cache.", "from": 3, "lines": 2, "truncated": False}

    status = seen["status"].structured_content
    assert status["files_indexed"] == 2 and status["served_by"] == served_by
    assert ("daemon" in status) == (served_by == "daemon")

    context = seen["context"]
    assert not context.is_error and context.structured_content["tokens"] <= 60
    assert context.content[0].text == context.structured_content["text"]
    assert context.content[0].text.startswith("### memory/2026-11-22.md#L1")

    for key in ("dated", "dated_context"):  # `now` reaches the search, which says how it read the query
        read = seen[key].structured_content["query"]
        assert read == {"dates": [{"text": "yesterday", "from": "2026-11-22", "to": "2026-11-22"}]}, key
    assert seen["dated"].structured_content["results"][0]["path"] == "memory/2026-11-22.md"

    assert seen["refused"].is_error and "'..' is refused" in seen["refused"].content[0].text
    assert seen["empty"].is_error and "the query is empty" in seen["empty"].content[0].text
    assert seen["bad_number"].is_error and "'maxResults' must be an integer" in seen["bad_number"].content[0].text


def over_stdio(settings: Settings, socket_path: Path, errlog: Path) -> dict[str, Any]:
    params = StdioServerParameters(command=sys.executable, args=server_args(settings, socket_path), env=server_env())

    async def run() -> dict[str, Any]:
        with errlog.open("w") as log:
            async with stdio_client(params, errlog=log) as (read, write):
                with anyio.fail_after(STARTUP):
                    return await exercise(read, write)

    return anyio.run(run)


def test_stdio_without_a_daemon(indexed: Settings, sock_dir: Path, tmp_path: Path) -> None:
    check(over_stdio(indexed, sock_dir / "none.sock", tmp_path / "err.log"), "index")


def test_stdio_with_a_daemon(indexed: Settings, workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        check(over_stdio(indexed, settings.socket_path, tmp_path / "err.log"), "daemon")


def test_stdio_before_any_index_answers_tool_errors(workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\n")
    params = StdioServerParameters(command=sys.executable, env=server_env(), args=[
        "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--index", str(tmp_path / "none.sqlite"),
        "--socket", str(sock_dir / "none.sock")])

    async def run() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            with anyio.fail_after(STARTUP):
                await session.initialize()
                return await session.call_tool("memory_search", {"query": "anything"})

    answer = anyio.run(run)
    assert answer.is_error and "no index" in answer.content[0].text


class HttpServer:
    """`clawmem mcp --http --port 0` as a process, with the URL it prints on stderr."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, *args], env=server_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = wait_until(self._url, timeout=STARTUP, message="the server's URL on stderr")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def _url(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"clawmem mcp exited with {self.proc.returncode}")
        while not self.lines.empty():
            found = re.search(r"http://127\.0\.0\.1:\d+/mcp", self.lines.get())
            if found:
                return found.group(0)
        return None

    def stop(self) -> int:
        status = stop_process(self.proc)  # type: ignore[arg-type]
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return status


def http_token() -> str:
    """The token `clawmem mcp --http` made on first use (XDG_CONFIG_HOME is the test's own)."""
    return (Path(os.environ["XDG_CONFIG_HOME"]) / "clawmem" / "mcp-token").read_text().strip()


def over_http(url: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        import httpx2

        authorized = httpx2.AsyncClient(headers={"Authorization": f"Bearer {http_token()}"},
                                        timeout=httpx2.Timeout(30.0, read=300.0))
        async with authorized, streamable_http_client(url, http_client=authorized) as (read, write):
            with anyio.fail_after(STARTUP):
                return await exercise(read, write)

    return anyio.run(run)


@pytest.mark.parametrize("with_daemon", [False, True], ids=["no-daemon", "daemon"])
def test_streamable_http_on_localhost(indexed: Settings, workspace: Path, tmp_path: Path, sock_dir: Path,
                                      with_daemon: bool) -> None:
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    daemon = running_daemon(settings) if with_daemon else None
    live = daemon.__enter__() if daemon is not None else None
    try:
        if live is not None:
            wait_until(lambda: live.writer.counts["sync"] >= 1, message="the start-up sync")
        server = HttpServer(server_args(indexed, settings.socket_path, "--http", "--port", "0"))
        try:
            assert server.url.startswith("http://127.0.0.1:")
            check(over_http(server.url), "daemon" if with_daemon else "index")
        finally:
            assert server.stop() == 0
    finally:
        if daemon is not None:
            daemon.__exit__(None, None, None)


def test_a_port_in_use_is_a_clear_error(indexed: Settings, sock_dir: Path) -> None:
    server = HttpServer(server_args(indexed, sock_dir / "none.sock", "--http", "--port", "0"))
    try:
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        out = subprocess.run([sys.executable, *server_args(indexed, sock_dir / "none.sock", "--http", "--port", port)],
                             env=server_env(), capture_output=True, text=True, timeout=STARTUP,
                             stdin=subprocess.DEVNULL, check=False)
        assert out.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in out.stderr
    finally:
        server.stop()


def test_the_server_loads_no_index_code_before_the_first_call(indexed: Settings, sock_dir: Path) -> None:
    probe = ("import sys\nfrom clawmem_index.api import Client\nfrom clawmem_index.mcp.server import build_server\n"
             f"build_server(Client({str(indexed.workspace)!r}, socket={str(sock_dir / 'none.sock')!r}))\n"
             "print(sorted(m for m in ('clawmem_index.engine.core', 'apsw', 'tiktoken', 'numpy', 'structlog')"
             " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], env=server_env(), capture_output=True, text=True,
                         timeout=STARTUP, check=True)
    assert out.stdout.strip() == "[]"



def test_the_handshake_waits_for_no_index_and_no_model(indexed: Settings, sock_dir: Path, tmp_path: Path) -> None:
    """`initialize` and `tools/list` from the real command while a writer holds the index locked and the provider is
    the local model: both are answered, and the process has loaded no engine, SQLite or model code when they are."""
    import apsw

    holder = apsw.Connection(str(indexed.index_path))
    holder.execute("BEGIN EXCLUSIVE")  # a reader opening the index now waits for its busy timeout
    errlog = tmp_path / "importtime.txt"
    env = {**server_env(), "CLAWMEM_PROVIDER": "local"}
    with errlog.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-X", "importtime", *server_args(indexed, sock_dir / "none.sock")],
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdin is not None and proc.stdout is not None

    def ask(message: dict[str, Any]) -> dict[str, Any]:
        proc.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        if "id" not in message:
            return {}
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP)
        assert ready, f"no answer to {message['method']}"
        return dict(json.loads(proc.stdout.readline()))  # type: ignore[union-attr]

    try:
        init = ask({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert init["result"]["serverInfo"]["name"] == "clawmem"
        ask({"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = ask({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert [tool["name"] for tool in listed["result"]["tools"]][0] == "memory_search"
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
        holder.execute("ROLLBACK")
        holder.close()
    imported = {line.split("|")[-1].strip() for line in errlog.read_text().splitlines() if line.startswith("import")}
    assert "clawmem_index.mcp.server" in imported, "the import log is read"
    assert not imported & {"clawmem_index.engine.core", "clawmem_index.index.store", "apsw", "llama_cpp", "numpy"}


# -- the tools without a transport ---------------------------------------------------------------


def test_tool_arguments_are_checked_leniently_and_named(indexed: Settings, sock_dir: Path) -> None:
    with Client(indexed.workspace, index=indexed.index_path, socket=sock_dir / "none.sock", provider="none") as client:
        assert not call_tool(client, "memory_search", {"query": "sqlite", "maxResults": 2.0}).error
        assert not call_tool(client, "memory_search", {"query": "sqlite", "maxResults": "2", "minScore": "0"}).error
        for arguments, message in [
            ({}, "memory_search needs 'query'"),
            ({"query": 3}, "'query' must be a string"),
            ({"query": "x", "maxResults": 2.5}, "'maxResults' must be an integer"),
            ({"query": "x", "maxResults": 0}, "'maxResults' must be between 1 and 1000"),
            ({"query": "x", "minScore": 2}, "'minScore' must be between 0 and 1"),
            ({"query": "x", "maxResults": True}, "'maxResults' must be an integer"),
            ({"query": "x", "max_results": 3}, "unknown argument 'max_results' for memory_search"),
            ({"query": "x", "workspaces": "alpha"}, "'workspaces' must be an array of strings"),
            ({"query": "x", "workspaces": ["alpha", 3]}, "'workspaces' must be an array of strings"),
            ({"query": "x", "workspaces": [f"w{i}" for i in range(65)]},
             "'workspaces' must be an array of strings with at most 64 items"),
        ]:
            answer = call_tool(client, "memory_search", arguments)
            assert answer.error and message in answer.text, (arguments, answer.text)
        answer = call_tool(client, "memory_get", {"path": "MEMORY.md", "from": 0})
        assert answer.error and "'from' must be >= 1" in answer.text
        answer = call_tool(client, "memory_context", {"query": "zeppelin"})
        assert not answer.error and answer.text == "(no memory matched this query)" and answer.data["text"] == ""
        answer = call_tool(client, "memory_context", {"query": "sqlite", "budget": 0})
        assert not answer.error and answer.text == "(no memory lines fit in 0 tokens)"
        answer = call_tool(client, "memory_context", {"query": "x", "workspaces": {"alpha": 1}})
        assert answer.error and "'workspaces' must be an array of strings" in answer.text
        answer = call_tool(client, "memory_frobnicate", {})
        assert answer.error and "unknown tool" in answer.text


def test_naming_another_workspace_on_sqlite_is_a_tool_error(indexed: Settings, sock_dir: Path) -> None:
    with Client(indexed.workspace, index=indexed.index_path, socket=sock_dir / "none.sock", provider="none") as client:
        own = call_tool(client, "memory_search", {"query": "sqlite", "workspaces": ["ws"]})
        assert not own.error and own.data["results"], "this workspace's own name is no other workspace"
        for name in ("memory_search", "memory_context"):
            answer = call_tool(client, name, {"query": "sqlite", "workspaces": ["ws", "beta"]})
            assert answer.error and answer.data is None
            assert answer.text == 'only a shared index (index_backend = "postgres") searches other workspaces'


def test_the_tools_search_several_workspaces_of_a_shared_index(tmp_path: Path, pg_url: str, sock_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAWMEM_INDEX_BACKEND", "postgres")
    monkeypatch.setenv("CLAWMEM_INDEX_URL", pg_url)
    for name in ("alpha", "beta"):
        ws = tmp_path / name
        (ws / "memory").mkdir(parents=True)
        (ws / "MEMORY.md").write_text(f"# {name}\n\nThe {name} agent learned the database failover runbook.\n")
        index = MemoryIndex(load_settings(workspace=ws, overrides={"embedding.provider": "none"}))
        index.sync()
        index.close()
    with Client(tmp_path / "alpha", socket=sock_dir / "none.sock", provider="none") as client:
        names = ["alpha", "beta", "gamma"]
        answer = call_tool(client, "memory_search", {"query": "failover runbook", "workspaces": names})
        assert not answer.error, answer.text
        assert sorted((r["workspace"], r["path"]) for r in answer.data["results"]) == [("alpha", "MEMORY.md"),
                                                                                       ("beta", "MEMORY.md")]
        assert answer.data["unreadable_workspaces"] == ["gamma"]
        assert '"workspace":"beta"' in answer.text, "the model reads the same JSON"
        own = call_tool(client, "memory_search", {"query": "failover runbook"})
        assert [r["workspace"] for r in own.data["results"]] == ["alpha"] and "unreadable_workspaces" not in own.data
        context = call_tool(client, "memory_context", {"query": "failover runbook", "workspaces": names})
        assert not context.error, context.text
        assert sorted((s.get("workspace", ""), s["citation"]) for s in context.data["sections"]) == [
            ("", "MEMORY.md#L1-L3"), ("beta", "beta:MEMORY.md#L1-L3")]
        assert "### beta:MEMORY.md#L1-L3\n# beta\n\nThe beta agent learned the database failover runbook." \
            in context.text
        assert context.data["unreadable_workspaces"] == ["gamma"]


def test_a_failing_tool_is_a_tool_error_not_a_crash(indexed: Settings, sock_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    with Client(indexed.workspace, index=indexed.index_path, socket=sock_dir / "none.sock", provider="none") as client:
        monkeypatch.setattr(client, "search", broken)
        answer = call_tool(client, "memory_search", {"query": "sqlite"})
        assert answer.error and answer.text == "internal error in memory_search: RuntimeError: disk on fire"
        assert not call_tool(client, "memory_get", {"path": "MEMORY.md"}).error


def test_every_tool_has_a_schema_and_description() -> None:
    for tool in TOOLS:
        assert tool.input_schema["type"] == "object" and len(tool.description) > 60
        for name in tool.input_schema["required"]:
            assert name in tool.input_schema["properties"]


def test_stdio_answers_the_hostile_corpus_and_keeps_serving(indexed: Settings, sock_dir: Path) -> None:
    """Every hostile text (escaped in the JSON as a host would send it: lone surrogates as \\udXXX) as a query, a path
    and a context query, and every hostile JSON line: an answer or an error for each, and the server keeps serving."""
    from hostile import FIXED_JSON, FIXED_TEXTS

    proc = subprocess.Popen([sys.executable, *server_args(indexed, sock_dir / "none.sock")], env=server_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, Any] | str) -> None:
        line = message if isinstance(message, str) else json.dumps(message)  # ensure_ascii: \\udXXX escapes
        proc.stdin.write(line.encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def answer_to(rid: int) -> dict[str, Any]:
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], STARTUP)
            assert ready, f"no answer to request {rid}"
            raw = proc.stdout.readline()  # type: ignore[union-attr]
            assert raw, "the server hung up"
            message = json.loads(raw)
            if message.get("id") == rid:
                return dict(message)

    try:
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert "result" in answer_to(0)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        rid, outcomes = 0, []
        for text in FIXED_TEXTS.values():
            for name, arguments in (("memory_search", {"query": text}), ("memory_get", {"path": text}),
                                    ("memory_context", {"query": text, "budget": 50}),
                                    ("memory_search", {"query": "sqlite yesterday", "now": text})):
                rid += 1
                send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                      "params": {"name": name, "arguments": arguments}})
                got = answer_to(rid)
                assert "result" in got or "error" in got
                outcomes.append(bool(got.get("error") or got["result"].get("isError")))
        for body in FIXED_JSON.values():
            send(body.replace("\n", " "))
        rid += 1
        send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
              "params": {"name": "memory_search", "arguments": {"query": "sqlite"}}})
        last = answer_to(rid)
        assert not last["result"].get("isError") and last["result"]["structuredContent"]["results"]
        assert any(outcomes) and not all(outcomes)
    finally:
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()


def test_a_transcript_hit_is_not_sent_to_memory_get_blindly(workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    """The descriptions say that a sessions result is read from its snippet, and memory_get says why it refuses one."""
    (workspace / "MEMORY.md").write_text("# Memory\n")
    (workspace / "sessions").mkdir()
    (workspace / "sessions" / "s.jsonl").write_text(
        json.dumps({"type": "message", "message": {"role": "user", "content": "the okapi plan is on"}}) + "\n")
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             "embedding.provider": "none",
                                                             "sources": ["memory", "sessions"]})
    MemoryIndex(settings).sync()
    descriptions = {tool.name: tool.description for tool in TOOLS}
    assert 'source is "sessions"' in descriptions["memory_search"] and "its snippet is the text" in \
        descriptions["memory_search"]
    assert "transcripts (sessions/*.jsonl) too" in descriptions["memory_get"]
    with Client(workspace, index=settings.index_path, socket=sock_dir / "none.sock", provider="none") as client:
        found = call_tool(client, "memory_search", {"query": "okapi"})
        [hit] = found.data["results"]
        assert hit["source"] == "sessions" and "okapi" in hit["snippet"]
        refused = call_tool(client, "memory_get", {"path": hit["path"]})
        assert refused.error and "session transcripts are searched, not read" in refused.text


def test_a_context_block_says_what_it_does_not_cover_yet(indexed: Settings, sock_dir: Path) -> None:
    """The block goes into a prompt as it is: a note under it is the only way the agent learns it may be stale."""
    with Client(indexed.workspace, index=indexed.index_path, socket=sock_dir / "none.sock", provider="none") as client:
        fresh = call_tool(client, "memory_context", {"query": "sqlite"})
        assert not fresh.error and "Why sqlite" in fresh.text and "(note:" not in fresh.text
        (indexed.workspace / "memory" / "2026-11-26.md").write_text("# 2026-11-26\n\n- sqlite stays.\n")
        stale = call_tool(client, "memory_context", {"query": "sqlite"})
        assert stale.text == fresh.text + "\n(note: 1 file(s) changed since the last sync: not in this answer yet)"
        assert stale.data["index"]["pending_files"] == 1 and stale.data["text"] == fresh.data["text"]
