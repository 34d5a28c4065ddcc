"""MCP benchmarks: `memory_search` round trips through `clawmem mcp`, and its start-up time.

    python bench/bench_mcp.py [--chunks 10000] [--calls 400] [--starts 7] [--out bench/out/mcp.json]

- Round trip: a keyword-only daemon (search.mode = bm25) serves a generated workspace of about
  `--chunks` chunks (bench/generate.py notes); `clawmem mcp` runs as the stdio subprocess an agent
  host would launch, and the official SDK's ClientSession calls `memory_search` with the daemon
  benchmark's queries. Reported: p50/p95 per call, beside the same searches sent straight to the
  daemon's socket, so the MCP layer's own cost (stdio, the SDK, a worker thread, the client) shows.
- Start-up: the time from spawning `clawmem mcp` to the answer to `initialize` (median of
  `--starts`), beside the time to import the SDK alone and a bare interpreter start.

Goals: p50 < 10 ms, start-up < 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_daemon import Conn, Daemon, _query, build_index  # noqa: E402
from generate import generate  # noqa: E402

GOAL_P50_MS = 10.0
GOAL_START_S = 0.5


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in seconds)
    return {"p50_ms": round(ms[len(ms) // 2], 2), "p95_ms": round(ms[int(len(ms) * 0.95)], 2),
            "max_ms": round(ms[-1], 2), "calls": len(ms)}


def server_params(workspace: Path, index: Path, sock: Path) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, env=dict(os.environ), args=[
        "-m", "clawmem_index", "mcp", "--workspace", str(workspace), "--index", str(index), "--socket", str(sock)])


def mcp_round_trips(workspace: Path, index: Path, sock: Path, calls: int) -> dict[str, Any]:
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    rng = random.Random(11)
    latencies: list[float] = []
    served: list[str] = []

    async def run() -> None:
        async with stdio_client(server_params(workspace, index, sock)) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(20):  # warm-up: the daemon connection, the SDK's validators
                await session.call_tool("memory_search", {"query": _query(rng)})
            for _ in range(calls):
                query = _query(rng)
                started = time.perf_counter()
                answer = await session.call_tool("memory_search", {"query": query})
                latencies.append(time.perf_counter() - started)
                if answer.is_error:
                    raise RuntimeError(answer.content[0].text)
            status = await session.call_tool("memory_status", {})
            served.append(status.structured_content["served_by"])

    anyio.run(run)
    return {**percentiles(latencies), "served_by": served[0]}


def socket_round_trips(sock: Path, calls: int) -> dict[str, Any]:
    rng = random.Random(11)
    conn = Conn(sock)
    for _ in range(20):
        conn.call("search", {"query": _query(rng)})
    latencies = []
    for _ in range(calls):
        query = _query(rng)
        started = time.perf_counter()
        conn.call("search", {"query": query})
        latencies.append(time.perf_counter() - started)
    conn.close()
    return percentiles(latencies)


def start_up(workspace: Path, index: Path, sock: Path, runs: int) -> dict[str, Any]:
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async def once() -> float:
        started = time.perf_counter()
        async with stdio_client(server_params(workspace, index, sock)) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            return time.perf_counter() - started

    to_initialize = [anyio.run(once) for _ in range(runs)]
    return {"to_initialize_s": round(statistics.median(to_initialize), 3),
            "each_s": [round(x, 3) for x in to_initialize],
            "sdk_import_s": round(statistics.median(_timed([sys.executable, "-c", "import mcp.server.lowlevel"])
                                                    for _ in range(runs)), 3),
            "bare_python_s": round(statistics.median(_timed([sys.executable, "-c", "pass"]) for _ in range(runs)), 3)}


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - started


def chunks_per_file(work: Path, sample: int = 300) -> float:
    """What generated notes chunk into with the current chunker (measured on a sample, not assumed)."""
    built = build_index(generate(work / "sample", sample), work / "sample.sqlite", fake=False)
    return float(built["chunks"]) / sample


def run(chunks: int, calls: int, starts: int, work: Path) -> dict[str, Any]:
    n_files = max(2, round(chunks / chunks_per_file(work)))
    workspace = generate(work / "ws", n_files)
    (workspace / "clawmem.toml").write_text('[search]\nmode = "bm25"\n[embedding]\nprovider = "none"\n')
    index = work / "index.sqlite"
    built = build_index(workspace, index, fake=False)
    print(json.dumps({"workspace": built}), flush=True)
    sock = Path(tempfile.mkdtemp(prefix="cmm", dir="/tmp")) / "d.sock"
    daemon = Daemon(workspace, index, sock, fake=False)
    try:
        results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
                                   "workspace": {"files": n_files, **built}}
        results["socket_search"] = socket_round_trips(sock, calls)
        print(json.dumps({"socket_search": results["socket_search"]}), flush=True)
        results["mcp_search"] = mcp_round_trips(workspace, index, sock, calls)
        print(json.dumps({"mcp_search": results["mcp_search"]}), flush=True)
        results["start_up"] = start_up(workspace, index, sock, starts)
        print(json.dumps({"start_up": results["start_up"]}), flush=True)
    finally:
        daemon.stop()
        shutil.rmtree(sock.parent, ignore_errors=True)
    results["goals"] = {"mcp_search_p50_ms": {"goal": GOAL_P50_MS,
                                              "met": results["mcp_search"]["p50_ms"] < GOAL_P50_MS},
                        "start_up_s": {"goal": GOAL_START_S,
                                       "met": results["start_up"]["to_initialize_s"] < GOAL_START_S}}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--starts", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "mcp.json")
    parser.add_argument("--keep", action="store_true", help="keep the generated workspace")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="clawmem-bench-mcp-"))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    os.environ["CLAWMEM_PROVIDER"] = "none"
    try:
        results = run(args.chunks, args.calls, args.starts, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    search, start = results["mcp_search"], results["start_up"]
    print(f"memory_search over MCP (daemon, bm25, {results['workspace']['chunks']} chunks):"
          f" p50 {search['p50_ms']} ms, p95 {search['p95_ms']} ms (goal p50 < {GOAL_P50_MS:g} ms);"
          f" the socket alone: p50 {results['socket_search']['p50_ms']} ms")
    print(f"clawmem mcp start-up to initialize: {start['to_initialize_s']} s (goal < {GOAL_START_S:g} s);"
          f" importing the MCP SDK alone: {start['sdk_import_s']} s, a bare interpreter: {start['bare_python_s']} s")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
