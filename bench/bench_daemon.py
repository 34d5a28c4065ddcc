"""Daemon benchmarks: edit-to-searchable latency, socket query latency, RSS and idle CPU.

    python bench/bench_daemon.py [--edit-sizes 2000,20000] [--query-chunks 10000,100000]
                                 [--out bench/out/daemon.json]

- Edit latency: a daemon (keyword-only) watches a generated workspace; a unique word is appended to
  an existing note (or a new note is created) and the socket is polled every 2 ms until a search
  finds it. Reported: the latency *beyond the debounce* (debounce set to 0.3 s here).
- Query latency: 1 and 8 client processes, each on its own connection, send searches over the
  Unix socket; p50/p99 per request and throughput, keyword (bm25) and hybrid. Hybrid uses the
  deterministic FakeProvider (384-d, hashed words) inside the daemon: it measures the daemon's
  fusion and sqlite-vec KNN cost, not a model's (a real query embedding adds its own latency).
- Memory: the daemon's RSS idle after start-up, and the peak RSS sampled during the query load.
- Idle CPU: the daemon's user+system CPU seconds over 10 s with nothing happening.
- Transport: a one-line `get` round trip (socket + JSON-RPC + dispatch, no search work).

Workspaces come from bench/generate.py (~2 KB realistic notes, about 3 chunks each); indexes are
built before the daemon starts, so its start-up sync is a no-change stat pass. Every daemon is a
separate process and everything stays on a Unix socket under /tmp.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import VOCABULARY, WORDS, ZIPF, generate  # noqa: E402

DEBOUNCE = 0.3
FAKE_DIMS = 384
CHUNKS_PER_FILE = 2.95  # what bench/generate.py's notes chunk into at the default 400 tokens


# -- the daemon under test --------------------------------------------------------------------


def child_daemon(spec: str) -> None:
    """Runs in the daemon's process: `Daemon(...).serve_forever()`, with the FakeProvider if asked."""
    from clawmem_index.config import load_settings
    from clawmem_index.log import configure
    from clawmem_index.service.daemon import Daemon

    args = json.loads(spec)
    settings = load_settings(workspace=args["workspace"], overrides=args["overrides"])
    configure("warning")
    if args["fake"]:
        from clawmem_index.embeddings.fake import FakeProvider

        sys.exit(Daemon(settings, provider=FakeProvider(dims=FAKE_DIMS)).serve_forever())
    sys.exit(Daemon(settings).serve_forever())


def build_index(workspace: Path, index: Path, fake: bool) -> dict[str, Any]:
    from clawmem_index.config import load_settings
    from clawmem_index.engine.core import MemoryIndex

    settings = load_settings(workspace=workspace, overrides={"index": str(index), "embedding.provider": "none"})
    memory = MemoryIndex(settings, **({"provider": fake_provider()} if fake else {}))
    started = time.perf_counter()
    memory.sync()
    files, chunks = memory.reader().counts()
    memory.close()
    return {"files": files, "chunks": chunks, "build_s": round(time.perf_counter() - started, 2)}


def fake_provider() -> Any:
    from clawmem_index.embeddings.fake import FakeProvider

    return FakeProvider(dims=FAKE_DIMS)


class Daemon:
    def __init__(self, workspace: Path, index: Path, sock: Path, *, fake: bool) -> None:
        spec = json.dumps({"workspace": str(workspace), "fake": fake, "overrides": {
            "index": str(index), "socket": str(sock), "embedding.provider": "none",
            "daemon.debounce": DEBOUNCE, "daemon.max_delay": 10.0, "daemon.rescan_interval": 0}})
        self.sock = sock
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", spec], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}")
            try:
                status = rpc_once(sock, "status")
                daemon = status["daemon"]
                if daemon["runs"]["sync"] >= 1 and daemon["running"] is None and not daemon["queued"]:
                    break
            except (OSError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("daemon did not become idle")
            time.sleep(0.05)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


# -- a minimal client (stdlib only, like any language's) --------------------------------------


class Conn:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.ids = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self.ids += 1
        self.sock.sendall(json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method,
                                      "params": params or {}}).encode() + b"\n")
        answer = json.loads(self.file.readline())
        if "error" in answer:
            raise RuntimeError(answer["error"]["message"])
        return answer["result"]

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def rpc_once(path: Path, method: str, params: dict[str, Any] | None = None) -> Any:
    conn = Conn(path)
    try:
        return conn.call(method, params)
    finally:
        conn.close()


# -- measurements -----------------------------------------------------------------------------


def edit_latency(workspace: Path, daemon: Daemon, trials: int = 12) -> dict[str, Any]:
    rng = random.Random(3)
    notes = sorted((workspace / "memory").rglob("*.md"))
    conn = Conn(daemon.sock)
    beyond: list[float] = []
    kinds: list[str] = []
    try:
        for trial in range(trials):
            token = f"zqx{trial}q{rng.randrange(10**9)}"
            if trial % 4 == 3:
                target, kind = workspace / "memory" / f"bench-new-{trial}.md", "new file"
                started = time.perf_counter()
                target.write_text(f"# New\n{token}\n")
            else:
                target, kind = rng.choice(notes), "append"
                started = time.perf_counter()
                with target.open("a") as fh:
                    fh.write(f"\n- {token}\n")
            while not conn.call("search", {"query": token, "mode": "bm25", "min_score": 0})["results"]:
                time.sleep(0.002)
            beyond.append(time.perf_counter() - started - DEBOUNCE)
            kinds.append(kind)
    finally:
        conn.close()
    ms = sorted(x * 1000 for x in beyond)
    return {"trials": trials, "beyond_debounce_ms_p50": round(statistics.median(ms), 1),
            "beyond_debounce_ms_max": round(ms[-1], 1), "debounce_s": DEBOUNCE,
            "each_ms": [(kind, round(x * 1000, 1)) for kind, x in zip(kinds, beyond, strict=True)]}


def _query(rng: random.Random) -> str:
    """A common domain word and one or two more drawn as the notes' own words are (Zipf)."""
    return " ".join([rng.choice(WORDS), *rng.choices(VOCABULARY, weights=ZIPF, k=rng.choice((1, 2)))])


def _client(path: str, mode: str, n: int, seed: int, out: Any) -> None:
    rng = random.Random(seed)
    conn = Conn(Path(path))
    for _ in range(10):  # warm-up: this thread's read connection, caches
        conn.call("search", {"query": _query(rng), "mode": mode})
    latencies = []
    for _ in range(n):
        query = _query(rng)
        started = time.perf_counter()
        conn.call("search", {"query": query, "mode": mode})
        latencies.append(time.perf_counter() - started)
    conn.close()
    out.put(latencies)


def query_latency(daemon: Daemon, mode: str, clients: int, per_client: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(str(daemon.sock), mode, per_client, seed, out))
             for seed in range(clients)]
    peak = daemon.rss_mb()
    started = time.perf_counter()
    for p in procs:
        p.start()
    results: list[float] = []
    while len(results) < clients * per_client:
        try:
            results.extend(out.get(timeout=0.05))
        except Exception:  # queue.Empty: sample memory while the load runs
            peak = max(peak, daemon.rss_mb())
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    ms = sorted(x * 1000 for x in results)
    return {"mode": mode, "clients": clients, "requests": len(ms), "p50_ms": round(ms[len(ms) // 2], 2),
            "p99_ms": round(ms[int(len(ms) * 0.99)], 2), "throughput_rps": round(len(ms) / elapsed, 1),
            "peak_rss_mb": round(peak, 1)}


def transport_latency(daemon: Daemon, n: int = 400) -> dict[str, Any]:
    """A `get` of one line: the socket, framing, dispatch and pool hand-off, with no search work."""
    conn = Conn(daemon.sock)
    latencies = []
    for _ in range(n):
        started = time.perf_counter()
        conn.call("get", {"path": "MEMORY.md", "lines": 1})
        latencies.append(time.perf_counter() - started)
    conn.close()
    ms = sorted(x * 1000 for x in latencies)
    return {"get_p50_ms": round(ms[len(ms) // 2], 3), "get_p99_ms": round(ms[int(len(ms) * 0.99)], 3)}


def idle_cpu(daemon: Daemon, seconds: float = 10.0) -> dict[str, Any]:
    before = daemon.cpu_s()
    time.sleep(seconds)
    return {"idle_seconds": seconds, "cpu_seconds": round(daemon.cpu_s() - before, 3)}


# -- the runs ---------------------------------------------------------------------------------


def run(edit_sizes: list[int], query_chunks: list[int], work: Path, layout: str = "folders") -> dict[str, Any]:
    results: dict[str, Any] = {"edit": [], "query": [], "layout": layout,
                               "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    for n_files in edit_sizes:
        ws = generate(work / f"edit{n_files}", n_files, layout=layout)
        built = build_index(ws, work / f"edit{n_files}.sqlite", fake=False)
        sock = Path(tempfile.mkdtemp(prefix="cmb", dir="/tmp")) / "d.sock"
        daemon = Daemon(ws, work / f"edit{n_files}.sqlite", sock, fake=False)
        try:
            entry = {"files": n_files, **built, "idle_rss_mb": round(daemon.rss_mb(), 1)}
            entry.update(edit_latency(ws, daemon))
            entry.update(idle_cpu(daemon))
            results["edit"].append(entry)
            print(json.dumps(entry), flush=True)
        finally:
            daemon.stop()
            shutil.rmtree(sock.parent, ignore_errors=True)
    for chunks in query_chunks:
        n_files = max(2, round(chunks / CHUNKS_PER_FILE))
        ws = generate(work / f"query{n_files}", n_files, layout=layout)
        built = build_index(ws, work / f"query{n_files}.sqlite", fake=True)
        sock = Path(tempfile.mkdtemp(prefix="cmb", dir="/tmp")) / "d.sock"
        daemon = Daemon(ws, work / f"query{n_files}.sqlite", sock, fake=True)
        try:
            base = {"files": n_files, **built, "idle_rss_mb": round(daemon.rss_mb(), 1), **transport_latency(daemon)}
            for mode in ("bm25", "hybrid"):
                for clients, per_client in ((1, 400), (8, 100)):
                    entry = {**base, **query_latency(daemon, mode, clients, per_client)}
                    results["query"].append(entry)
                    print(json.dumps(entry), flush=True)
            results.setdefault("idle", []).append({"chunks": built["chunks"], **idle_cpu(daemon)})
        finally:
            daemon.stop()
            shutil.rmtree(sock.parent, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--edit-sizes", default="2000,20000")
    parser.add_argument("--query-chunks", default="10000,100000")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "daemon.json")
    parser.add_argument("--keep", action="store_true", help="keep the generated workspaces")
    parser.add_argument("--layout", choices=("folders", "flat"), default="folders",
                        help="flat: every note a daily log in memory/YYYY-MM-DD.md (OpenClaw's layout)")
    args = parser.parse_args()
    if args.child:
        child_daemon(args.child)
        return
    work = Path(tempfile.mkdtemp(prefix="clawmem-bench-"))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    try:
        results = run([int(x) for x in args.edit_sizes.split(",") if x],
                      [int(x) for x in args.query_chunks.split(",") if x], work, args.layout)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
