"""MCP sessions against `clawmem mcp --http`: a flood, and many real SDK clients at once.

    python bench/bench_mcp_sessions.py [--sessions 10000] [--threads 8] [--out bench/out/mcp_sessions.json]
    python bench/bench_mcp_sessions.py --clients 64 [--out bench/out/mcp_clients.json]

A real `clawmem mcp --http --port 0` process (keyword-only) serves a small workspace.

Flood (default): attackers holding the token (the worst case: a local process of the same user)
send `initialize` requests, each opening a session that is never used again, from several threads,
bounded in count. The server's RSS is sampled every 20 ms. After the flood, a legitimate client
opens a session and calls `memory_search`: the time until it has its answer is what matters (the
SDK's default refused every new session for up to 30 minutes once 10,000 were open).

Clients (`--clients N`): N real MCP SDK clients (`streamable_http_client` + `ClientSession`, each on
its own connections) connect one after another, each initializing (which opens its GET stream) and
calling `memory_search`; all stay connected. Then each calls `memory_search` again: "held" are the
clients still served, "told to re-initialize" those whose session was ended to make room. Last, one
more client connects and is timed. RSS and open file descriptors of the server are read with all
N connected.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def post(port: int, token: str, body: dict[str, Any], session: str | None = None) -> tuple[int, str | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {token}"}
    if session:
        headers["Mcp-Session-Id"] = session
    conn.request("POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
    answer = conn.getresponse()
    result = answer.status, answer.getheader("mcp-session-id"), answer.read()
    conn.close()
    return result


@contextlib.contextmanager
def running_server() -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    """A keyword-only `clawmem mcp --http --port 0` on a fresh small workspace: (process, port, token)."""
    with tempfile.TemporaryDirectory(prefix="clawmem-mcp-bench-") as tmp:
        root = Path(tmp)
        workspace = root / "ws"
        (workspace / "memory").mkdir(parents=True)
        (workspace / "MEMORY.md").write_text("# Memory\nThe staging server is pinecone.\n")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}, "CLAWMEM_PROVIDER": "none",
               "XDG_CONFIG_HOME": str(root / "config"), "XDG_CACHE_HOME": str(root / "cache")}
        subprocess.run([sys.executable, "-m", "clawmem_index", "index", "--workspace", str(workspace)], env=env,
                       check=True, capture_output=True)
        proc = subprocess.Popen([sys.executable, "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--http",
                                 "--port", "0", "--socket", str(root / "none.sock")], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            port = int(re.search(r":(\d+)/mcp", proc.stderr.readline()).group(1))  # type: ignore[union-attr]
            token_file = root / "config" / "clawmem" / "mcp-token"  # absent for a server that asks none
            token = token_file.read_text().strip() if token_file.exists() else ""
            post(port, token, INIT)  # the SDK and the tools are loaded
            yield proc, port, token
        finally:
            proc.terminate()
            proc.wait(30)


def flood(args: argparse.Namespace) -> dict[str, Any]:
    with running_server() as (proc, port, token):
        before = rss_mb(proc.pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], rss_mb(proc.pid))

        statuses: dict[int, int] = {}
        lock = threading.Lock()
        left = [args.sessions]

        def attack() -> None:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                status = post(port, token, INIT)[0]
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        attackers = [threading.Thread(target=attack) for _ in range(args.threads)]
        for t in attackers:
            t.start()
        for t in attackers:
            t.join()
        flood_s = time.perf_counter() - started
        legit_started = time.perf_counter()
        status, session, _ = post(port, token, INIT)
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "memory_search", "arguments": {"query": "staging server"}}}
        found = post(port, token, call, session) if status == 200 else (status, None, b"")
        legit_s = time.perf_counter() - legit_started
        done.set()
        after = rss_mb(proc.pid)
    return {"sessions_opened": args.sessions, "threads": args.threads, "flood_seconds": round(flood_s, 1),
            "statuses": statuses, "rss_before_mb": round(before, 1), "rss_peak_mb": round(peak[0], 1),
            "rss_after_mb": round(after, 1), "legitimate_client_status": [status, found[0]],
            "legitimate_client_answered": b"pinecone" in found[2], "legitimate_client_s": round(legit_s, 3)}


def clients(count: int) -> dict[str, Any]:
    import anyio
    import httpx2
    from mcp import ClientSession, MCPError
    from mcp.client.streamable_http import streamable_http_client

    with running_server() as (proc, port, token):
        url = f"http://127.0.0.1:{port}/mcp"
        before = rss_mb(proc.pid)
        outcome: dict[str, int] = {}
        connect_s: list[float] = []

        async def connect(stack: contextlib.AsyncExitStack) -> Any:
            """An initialized SDK client, once its GET stream is open (seen by a response hook)."""
            streaming = anyio.Event()

            async def seen(response: Any) -> None:
                if response.request.method == "GET" and response.status_code == 200:
                    streaming.set()

            http = await stack.enter_async_context(httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60.0, read=600.0),
                event_hooks={"response": [seen]}))
            read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            await streaming.wait()
            return session

        async def search(session: Any) -> str:
            try:
                answer = await session.call_tool("memory_search", {"query": "staging server"})
            except MCPError as exc:
                return "told to re-initialize" if "initialize a new session" in exc.message else exc.message
            return "held" if not answer.is_error and "pinecone" in answer.content[0].text else "tool error"

        async def run() -> tuple[float, int, str, float]:
            with anyio.fail_after(60 + count):  # outside the stack: its task groups must close inside this scope
                async with contextlib.AsyncExitStack() as stack:
                    sessions = []
                    for _ in range(count):
                        started = time.perf_counter()
                        session = await connect(stack)
                        assert await search(session) == "held"
                        connect_s.append(time.perf_counter() - started)
                        sessions.append(session)
                    with_all = rss_mb(proc.pid)
                    fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
                    for session in sessions:
                        kind = await search(session)
                        outcome[kind] = outcome.get(kind, 0) + 1
                    started = time.perf_counter()
                    try:
                        newcomer = await search(await connect(stack))
                    except MCPError as exc:  # before the fix: 503 "Too many open sessions"
                        newcomer = f"refused: {exc.message}"
                    return with_all, fds, newcomer, time.perf_counter() - started

        with_all, fds, newcomer, newcomer_s = anyio.run(run)
    connect_s.sort()
    return {"clients": count, "outcome": outcome, "rss_before_mb": round(before, 1),
            "rss_with_all_connected_mb": round(with_all, 1), "server_fds_with_all_connected": fds,
            "connect_and_first_call_s_median": round(connect_s[len(connect_s) // 2], 3),
            "connect_and_first_call_s_max": round(connect_s[-1], 3),
            "newcomer": newcomer, "newcomer_connect_and_call_s": round(newcomer_s, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--clients", type=int, default=0, help="run the clients phase with this many SDK clients")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not 0 <= args.clients <= 1000:
        parser.error("--clients is 0 (flood) to 1000")
    result = clients(args.clients) if args.clients else flood(args)
    name = "mcp_clients.json" if args.clients else "mcp_sessions.json"
    out = args.out or Path(__file__).resolve().parent / "out" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
