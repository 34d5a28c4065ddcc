"""`clawmem mcp --http`: a bearer token on every request, bounded sessions, bounded bodies, Host checks kept."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from daemon_helpers import wait_until
from hostile import FIXED_JSON, FIXED_TEXTS, FIXED_TOKEN_FILES

from clawmem_index.mcp.http import MAX_BODY_BYTES, default_token_path, load_token

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


class Served:
    """build_app on a uvicorn server in this process, on a free 127.0.0.1 port."""

    def __init__(self, workspace: Path, index: Path, sock: Path, **limits: Any) -> None:
        import uvicorn

        from clawmem_index.api import Client
        from clawmem_index.mcp.http import build_app
        from clawmem_index.mcp.server import build_server

        self.token = "t" * 20 + "-test-token"
        self.client = Client(workspace, index=index, socket=sock, provider="none")
        self.app = build_app(build_server(self.client), self.token, path="/mcp", host="127.0.0.1", **limits)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [listener]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, message="uvicorn to start")

    def post(self, body: bytes | dict[str, Any], *, token: str | None = "", session: str | None = None,
             host: str | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "Host": host or f"127.0.0.1:{self.port}"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token}"
        if session:
            headers["Mcp-Session-Id"] = session
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", "/mcp", body=raw, headers=headers)
        answer = conn.getresponse()
        result = answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        conn.close()
        return result

    def open_session(self) -> str:
        status, headers, _ = self.post(INIT)
        assert status == 200, status
        return headers["mcp-session-id"]

    def ping(self, session: str) -> int:
        return self.post({"jsonrpc": "2.0", "id": 2, "method": "ping"}, session=session)[0]

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.client.close()


@pytest.fixture
def served(workspace: Path, tmp_path: Path) -> Iterator[Any]:
    (workspace / "MEMORY.md").write_text("# Memory\nThe staging server is pinecone.\n")
    made: list[Served] = []

    def start(**limits: Any) -> Served:
        server = Served(workspace, tmp_path / "index.sqlite", tmp_path / "none.sock", **limits)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


def test_without_the_token_nothing_is_served(served: Any) -> None:
    server = served()
    for token in (None, "wrong-token-of-some-length", server.token + "x", server.token[:-1]):
        status, headers, body = server.post(INIT, token=token)
        assert status == 401, token
        assert headers["www-authenticate"].startswith("Bearer")
        assert b"pinecone" not in body
    status, headers, _ = server.post(INIT)
    assert status == 200 and headers["mcp-session-id"]


def test_host_and_origin_checks_stay_on(served: Any) -> None:
    server = served()
    assert server.post(INIT, host="evil.example:80")[0] in (400, 421)


def test_a_body_over_the_limit_is_refused(served: Any) -> None:
    server = served()
    status, _, _ = server.post(b"[" + b" " * (MAX_BODY_BYTES + 10) + b"]")
    assert status == 413
    assert server.open_session()


def test_at_the_session_cap_the_longest_idle_session_makes_room(served: Any) -> None:
    server = served(max_sessions=3)
    sessions = [server.open_session() for _ in range(3)]
    assert server.ping(sessions[0]) == 200  # now the first was used last: the second is idle longest
    newer = [server.open_session() for _ in range(2)]  # never a 503: the idle ones make room
    assert server.ping(sessions[1]) == 404 and server.ping(sessions[2]) == 404
    assert all(server.ping(s) == 200 for s in (sessions[0], *newer))
    manager = server.app.state.session_manager
    assert len(manager._server_instances) == 3


def test_an_idle_session_expires(served: Any) -> None:
    server = served(idle_seconds=0.3)
    session = server.open_session()
    assert server.ping(session) == 200
    live = server.app.state.session_manager._server_instances  # watched without a request, which would renew it
    wait_until(lambda: session not in live, timeout=10, interval=0.05, message="the idle session to expire")
    assert server.ping(session) == 404
    assert server.open_session()


async def sdk_client(server: Served, stack: AsyncExitStack) -> Any:
    """A real SDK client on its own connections, initialized: like any SDK client it then holds a GET stream."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    http = await stack.enter_async_context(httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {server.token}"}, timeout=httpx2.Timeout(30.0, read=300.0)))
    read, write = await stack.enter_async_context(
        streamable_http_client(f"http://127.0.0.1:{server.port}/mcp", http_client=http))
    session = await stack.enter_async_context(ClientSession(read, write))
    with anyio.fail_after(30):
        await session.initialize()
    return session


def streaming(server: Served) -> set[str]:
    """The sessions that hold their GET stream now."""
    from mcp.server.streamable_http import GET_STREAM_KEY

    live = dict(server.app.state.session_manager._server_instances)
    return {sid for sid, transport in live.items() if GET_STREAM_KEY in transport._request_streams}


async def wait_for(predicate: Any, message: str, timeout: float = 10) -> None:
    """wait_until on a worker thread, so the SDK clients on this event loop keep running meanwhile."""
    await anyio.to_thread.run_sync(lambda: wait_until(predicate, timeout=timeout, message=message))


async def read_memory(client: Any) -> bool:
    """One tool call: memory_get of MEMORY.md, answered with its text."""
    with anyio.fail_after(30):
        answer = await client.call_tool("memory_get", {"path": "MEMORY.md"})
    return not answer.is_error and "pinecone" in answer.content[0].text


def test_at_the_cap_of_sdk_clients_holding_streams_a_new_one_is_served(served: Any) -> None:
    from mcp import MCPError

    server = served(max_sessions=4)

    async def run() -> None:
        async with AsyncExitStack() as stack:
            clients = [await sdk_client(server, stack) for _ in range(4)]
            await wait_for(lambda: len(streaming(server)) == 4, "each SDK client to hold its GET stream")
            for client in clients:  # the first is now the least recently used
                assert await read_memory(client)
            newcomer = await sdk_client(server, stack)
            assert await read_memory(newcomer)
            with pytest.raises(MCPError, match="session not found.*initialize a new session"):
                await read_memory(clients[0])
            for client in clients[1:]:
                assert await read_memory(client)

    anyio.run(run)
    assert len(server.app.state.session_manager._server_instances) <= 4


def test_a_session_holding_only_its_get_stream_expires_when_idle(served: Any) -> None:
    from mcp import MCPError

    server = served(idle_seconds=1.0)
    live = server.app.state.session_manager._server_instances  # watched without a request, which would renew it

    async def run() -> None:
        async with AsyncExitStack() as stack:
            client = await sdk_client(server, stack)
            await wait_for(lambda: streaming(server), "the SDK client to hold its GET stream")
            held = next(iter(live))
            await wait_for(lambda: held not in live, "the idle session to expire though its stream is open")
            with pytest.raises(MCPError, match="initialize a new session"):
                await read_memory(client)
            assert await read_memory(await sdk_client(server, stack))

    anyio.run(run)


def test_a_session_has_one_get_stream_at_most(served: Any) -> None:
    server = served()
    session = server.open_session()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {server.token}", "Mcp-Session-Id": session,
               "Host": f"127.0.0.1:{server.port}"}
    conn.request("GET", "/mcp", headers=headers)
    assert conn.getresponse().status == 200  # the stream stays open
    wait_until(lambda: session in streaming(server), message="the GET stream to open")
    second = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    second.request("GET", "/mcp", headers=headers)
    assert second.getresponse().status == 409
    second.close()
    conn.close()


def test_hostile_bodies_get_http_or_json_rpc_errors_and_the_server_keeps_serving(served: Any) -> None:
    server = served()
    session = server.open_session()
    for name, body in FIXED_JSON.items():
        status, _, _ = server.post(body.encode(), session=session)
        assert 200 <= status < 500, name
    for name, text in FIXED_TEXTS.items():
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "memory_search", "arguments": {"query": text}}}
        status, _, _ = server.post(json.dumps(call, ensure_ascii=True).encode(), session=session)
        assert status < 500, name
    assert server.ping(session) == 200


# -- the token file ------------------------------------------------------------------------------


def test_the_token_is_made_once_private_and_reused(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    token, path, created = load_token(environ=environ)
    assert created and path == default_token_path(environ) and len(token) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_token(environ=environ) == (token, path, False)


def test_a_given_token_file_is_used_and_a_readable_one_refused(tmp_path: Path) -> None:
    from clawmem_index.errors import ConfigError

    given = tmp_path / "token"
    given.write_text("my-own-token-0123456789\n")
    given.chmod(0o600)
    assert load_token(given) == ("my-own-token-0123456789", given, False)
    given.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by other users"):
        load_token(given)
    short = tmp_path / "short"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="at least 16"):
        load_token(short)


def test_the_cli_says_where_the_token_is_and_never_prints_it(tmp_path: Path, workspace: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\n")
    env = {**os.environ, "CLAWMEM_PROVIDER": "none"}
    args = [sys.executable, "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--index",
            str(tmp_path / "i.sqlite"), "--socket", str(tmp_path / "none.sock")]
    proc = subprocess.Popen([*args, "--http", "--port", "0"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline(), proc.stderr.readline()]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    token = default_token_path(env).read_text().strip()
    assert "Authorization: Bearer <token>" in lines[1] and str(default_token_path(env)) in lines[1]
    assert token not in "".join(lines)
    usage = subprocess.run([*args, "--port", "8765"], env=env, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "--port and --token-file are for --http" in usage.stderr


#: Token files that are not regular files of the user's (or are not there): refused without being opened blocking.
TOKEN_FILE_KINDS = ("missing", "fifo", "directory", "device", "symlink", "readable by others", "in a missing folder")


def hostile_token_file(tmp_path: Path, case: str) -> Path:
    path = tmp_path / "token"
    if case in FIXED_TOKEN_FILES:
        path.write_bytes(FIXED_TOKEN_FILES[case])
        path.chmod(0o600)
    elif case == "fifo":
        os.mkfifo(path, 0o600)  # opened for reading, it would wait for a writer forever
    elif case == "directory":
        path.mkdir(mode=0o700)
    elif case == "device":
        return Path("/dev/null")
    elif case in ("symlink", "readable by others"):
        real = tmp_path / "real-token"
        real.write_text("a-fine-token-0123456789\n")
        real.chmod(0o600 if case == "symlink" else 0o644)
        if case == "symlink":
            path.symlink_to(real)
        else:
            path = real
    elif case == "in a missing folder":
        return tmp_path / "no-such-folder" / "token"
    return path


@pytest.mark.parametrize("case", [*FIXED_TOKEN_FILES, *TOKEN_FILE_KINDS])
def test_an_unusable_token_file_is_one_line_and_exit_2(case: str, tmp_path: Path, workspace: Path) -> None:
    path = hostile_token_file(tmp_path, case)
    out = subprocess.run([sys.executable, "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--index",
                          str(tmp_path / "i.sqlite"), "--socket", str(tmp_path / "none.sock"), "--http", "--port", "0",
                          "--token-file", str(path)], env={**os.environ, "CLAWMEM_PROVIDER": "none"},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    lines = out.stderr.splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"clawmem: error: the MCP token file {path} "), out.stderr
    assert "http://" not in out.stderr  # refused before anything listens


def test_a_token_of_any_visible_ascii_is_accepted(tmp_path: Path) -> None:
    given = tmp_path / "token"
    token = "".join(chr(c) for c in range(0x21, 0x7F))  # letters, digits and every punctuation mark
    given.write_text(f"  {token}\r\n")
    given.chmod(0o600)
    assert load_token(given) == (token, given, False)


@pytest.mark.parametrize("case", ["fifo", "config folder is a file"])
def test_an_unusable_default_token_file_is_one_line_and_exit_2(case: str, tmp_path: Path, workspace: Path) -> None:
    env = {**os.environ, "CLAWMEM_PROVIDER": "none", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    if case == "fifo":
        default_token_path(env).parent.mkdir(mode=0o700, parents=True)
        os.mkfifo(default_token_path(env), 0o600)
    else:
        (tmp_path / "config").write_text("not a folder\n")
    out = subprocess.run([sys.executable, "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--index",
                          str(tmp_path / "i.sqlite"), "--socket", str(tmp_path / "none.sock"), "--http", "--port", "0"],
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    lines = out.stderr.splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(f"clawmem: error: the MCP token file {default_token_path(env)} ")
