"""A flood of MCP sessions against `clawmem mcp --http`: its memory stays bounded and the real client is served.

    python bench/bench_mcp_sessions.py [--sessions 10000] [--threads 8] [--out bench/out/mcp_sessions.json]

A real `clawmem mcp --http --port 0` process (keyword-only) serves a small workspace. Attackers
holding the token (the worst case: a local process of the same user) send `initialize` requests,
each opening a session that is never used again, from several threads, bounded in count. The
server's RSS is sampled every 20 ms. After the flood, a legitimate client opens a session and calls
`memory_search`: the time until it has its answer is what matters (the SDK's default refused every
new session for up to 30 minutes once 10,000 were open).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "mcp_sessions.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawmem-mcp-flood-") as tmp:
        root = Path(tmp)
        workspace = root / "ws"
        (workspace / "memory").mkdir(parents=True)
        (workspace / "MEMORY.md").write_text("# Memory\nThe staging server is pinecone.\n")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}, "CLAWMEM_PROVIDER": "none",
               "XDG_CONFIG_HOME": str(root / "config"), "XDG_CACHE_HOME": str(root / "cache")}
        subprocess.run([sys.executable, "-m", "clawmem_index", "index", "--workspace", str(workspace)], env=env, check=True,
                       capture_output=True)
        proc = subprocess.Popen([sys.executable, "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--http",
                                 "--port", "0", "--socket", str(root / "none.sock")], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            port = int(re.search(r":(\d+)/mcp", proc.stderr.readline()).group(1))  # type: ignore[union-attr]
            token_file = root / "config" / "clawmem" / "mcp-token"  # absent for a server that asks none
            token = token_file.read_text().strip() if token_file.exists() else ""
            post(port, token, INIT)  # the SDK and the tools are loaded
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
        finally:
            proc.terminate()
            proc.wait(30)
    result = {"sessions_opened": args.sessions, "threads": args.threads, "flood_seconds": round(flood_s, 1),
              "statuses": statuses, "rss_before_mb": round(before, 1), "rss_peak_mb": round(peak[0], 1),
              "rss_after_mb": round(after, 1), "legitimate_client_status": [status, found[0]],
              "legitimate_client_answered": b"pinecone" in found[2], "legitimate_client_s": round(legit_s, 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
