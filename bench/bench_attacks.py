"""Socket attacks on a real daemon: its memory stays bounded and a well-behaved client is still served.

    python bench/bench_attacks.py [--seconds 4] [--out bench/out/attacks.json]

A real `clawmem serve` process (keyword-only: CLAWMEM_PROVIDER=none) indexes a workspace holding
a 1 MB memory file made of 15 KB lines. For each attack the daemon's RSS is sampled from
/proc/PID/status every 10 ms (VmRSS; VmHWM, the kernel's peak, is reset through
/proc/PID/clear_refs before each attack when allowed), and a well-behaved client times a `status`
call on a new connection every 100 ms (connect, ask, read the answer):

- batch200: 8 connections, each sending JSON-RPC batches of 200 `get`s of the big file and
  reading the answers, as fast as they are answered (refused whole: at most 64 per batch);
- batch64: the same with batches of 64 (the most allowed): each reply is cut at 4 MiB;
- slow_readers: 256 connections (the connection cap) each pipelining three requests for large
  replies (a 64-`get` batch, a `get` of the most `max_bytes` allows, another batch of those) and never
  reading a byte.

Each attack runs on its own daemon, started on the index a first daemon built; the slow-reader
attack runs once more on a daemon that builds its own index first (indexing leaves the allocator
holding more, so that is the worst case). BENCH_DAEMON_ENV='{"NAME": "value"}' adds to the
daemon's environment (e.g. to try glibc's MALLOC_ARENA_MAX). `--provider local` runs the daemons
with the default local model (as a user's daemon runs), `--model-in-process` with it loaded in the
daemon itself (`embedding.isolate_local = false`) instead of its child process; the model process's
RSS is reported apart (`model_process_rss_mb`).

Prints one JSON object: per attack the RSS before and at its peak (MB), what the attackers got
back, and the status latencies (p50/max ms, how many were answered).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIG_FILE_BYTES = 1_000_000
LINE_BYTES = 15_000
ATTACK_CONNECTIONS = 8
SLOW_CONNECTIONS = 256
SAMPLE_EVERY = 0.01
STATUS_EVERY = 0.1
WORDS = ("sqlite", "index", "memory", "daemon", "socket", "budget", "reply", "batch", "zebra", "project")


# -- set-up ---------------------------------------------------------------------------------


def make_workspace(root: Path) -> Path:
    """MEMORY.md and a 1 MB memory/big.md of 15 KB lines (words, so it indexes like prose)."""
    ws = root / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Long-term\nWe chose SQLite for the index.\n")
    lines, size, n = [], 0, 0
    while size < BIG_FILE_BYTES:
        words: list[str] = []
        length = 0
        while length < LINE_BYTES - 20:
            word = f"{WORDS[(n * 7 + len(words)) % len(WORDS)]}{len(words) % 97}"
            words.append(word)
            length += len(word) + 1
        line = " ".join(words)[:LINE_BYTES - 1]
        lines.append(line)
        size += len(line) + 1
        n += 1
    (ws / "memory" / "big.md").write_text("\n".join(lines) + "\n")
    return ws


PROVIDER = {"name": "none", "isolate": True}


def spawn(ws: Path, sock: Path, index: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, CLAWMEM_PROVIDER=str(PROVIDER["name"]), CLAWMEM_LOG_LEVEL="error")
    env.update(json.loads(os.environ.get("BENCH_DAEMON_ENV", "{}")))
    isolate = "true" if PROVIDER["isolate"] else "false"
    (ws / "clawmem.toml").write_text("[daemon]\ndebounce = 0.2\nmax_delay = 1.0\nrescan_interval = 0\n"
                                     f"[embedding]\nisolate_local = {isolate}\n")
    return subprocess.Popen([sys.executable, "-m", "clawmem_index", "serve", "--workspace", str(ws), "--socket",
                             str(sock), "--index", str(index)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def wait_ready(proc: subprocess.Popen[bytes], sock: Path, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}")
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            daemon = call_once(sock, "status")["result"]["daemon"]
            if daemon["runs"]["sync"] >= 1 and daemon["running"] is None and not daemon["queued"]:
                return
        time.sleep(0.05)
    raise RuntimeError("the daemon did not finish its first sync in time")


def request(method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}


def call_once(sock_path: Path, method: str, timeout: float = 10.0) -> Any:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock_path))  # blocking: waits while the daemon's accept backlog is full
        s.settimeout(timeout)
        s.sendall(json.dumps(request(method)).encode() + b"\n")
        with s.makefile("rb") as f:
            return json.loads(f.readline())


# -- measuring ------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


def reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (`5` to clear_refs); False where the kernel does not allow it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class Watch:
    """Samples the daemon's RSS and times `status` from a well-behaved client until stopped.

    `mark()` starts a second phase (e.g. once every attacker is connected): latencies are
    summarised per phase, so a burst at the start does not hide the steady state, or the reverse.
    """

    def __init__(self, pid: int, sock: Path) -> None:
        self.pid, self.sock = pid, sock
        self.peak_rss = 0.0
        self.calls: list[tuple[int, str, float]] = []  # (phase, outcome, ms)
        self.phase = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample, daemon=True),
                         threading.Thread(target=self._status, daemon=True)]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def mark(self) -> None:
        self.phase += 1

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, KeyError):
                self.peak_rss = max(self.peak_rss, proc_status(self.pid)["VmRSS"])
            self._stop.wait(SAMPLE_EVERY)

    def _status(self) -> None:
        while not self._stop.wait(STATUS_EVERY):
            phase, started = self.phase, time.perf_counter()
            try:
                answer = call_once(self.sock, "status", timeout=30.0)
                outcome = "answered" if "result" in answer else f"error {answer['error']['code']}"
            except OSError as exc:
                outcome = f"failed: {type(exc).__name__}"
            self.calls.append((phase, outcome, (time.perf_counter() - started) * 1000))

    def summary(self, *phases: str) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_rss_mb_sampled": round(self.peak_rss, 1)}
        for n, name in enumerate(phases or ("status",)):
            calls = [(outcome, ms) for phase, outcome, ms in self.calls if phase == n]
            ms = sorted(ms for outcome, ms in calls if outcome == "answered")
            out[name] = {"calls": dict(Counter(outcome for outcome, _ in calls)),
                         "p50_ms": round(statistics.median(ms), 2) if ms else None,
                         "max_ms": round(ms[-1], 2) if ms else None}
        return out


# -- the attacks ----------------------------------------------------------------------------


def get_batch(n: int, max_bytes: int | None = None) -> bytes:
    params: dict[str, Any] = {"path": "memory/big.md"}
    if max_bytes is not None:
        params["max_bytes"] = max_bytes
    return json.dumps([request("get", params, rid=i) for i in range(n)]).encode() + b"\n"


def batch_attacker(sock_path: Path, line: bytes, until: float, seen: Counter[str], lock: threading.Lock) -> None:
    """Send the batch and read its answer (counted, not parsed: it may be megabytes), until `until`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(sock_path))
        with s.makefile("rb") as f:
            while time.monotonic() < until:
                s.sendall(line)
                answer = f.readline()
                if not answer:
                    key = "closed"
                elif answer.startswith(b"["):
                    results = answer.count(b'"result":')
                    errors = answer.count(b'"code":-32002')
                    key = f"batch: {results} results + {errors} x -32002, {len(answer) >> 10} KiB"
                else:
                    key = f"error {json.loads(answer)['error']['code']}"
                with lock:
                    seen[key] += 1
                if not answer:
                    return


def batch_attack(pid: int, sock: Path, size: int, seconds: float) -> dict[str, Any]:
    line = get_batch(size)
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    before = proc_status(pid)
    exact_peak = reset_peak(pid)
    until = time.monotonic() + seconds
    with Watch(pid, sock) as watch:
        attackers = [threading.Thread(target=batch_attacker, args=(sock, line, until, seen, lock))
                     for _ in range(ATTACK_CONNECTIONS)]
        for t in attackers:
            t.start()
        for t in attackers:
            t.join(seconds + 60)
    after = proc_status(pid)
    return {"attack": f"{ATTACK_CONNECTIONS} connections x batches of {size} gets of a 1 MB file",
            "seconds": seconds, "batch_line_bytes": len(line), "rss_before_mb": round(before["VmRSS"], 1),
            "rss_peak_mb": round(after["VmHWM"], 1) if exact_peak else None, **watch.summary(),
            "attackers_got": dict(seen.most_common())}


def slow_reader_attack(pid: int, sock: Path, seconds: float) -> dict[str, Any]:
    most = 512 << 10  # the largest `max_bytes` a `get` may ask for (clawmem_index.service.params.MAX_GET_BYTES)
    large = [get_batch(64), json.dumps(request("get", {"path": "memory/big.md", "max_bytes": most})).encode()
             + b"\n", get_batch(64, max_bytes=most)]
    before = proc_status(pid)
    exact_peak = reset_peak(pid)
    conns: list[socket.socket] = []
    refused: Counter[str] = Counter()
    started = time.monotonic()
    with Watch(pid, sock) as watch:
        for _ in range(SLOW_CONNECTIONS):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(sock))  # blocking: waits while the daemon's accept backlog is full
                s.settimeout(5)
                s.sendall(b"".join(large))  # and never read
            except OSError as exc:
                refused[type(exc).__name__] += 1
                s.close()
                continue
            conns.append(s)
        connected_at = time.monotonic()
        watch.mark()
        time.sleep(seconds)
        rss_during = proc_status(pid)["VmRSS"]
        ended_at = time.monotonic()
    still_open = sum(_open(s) for s in conns)
    for s in conns:
        s.close()
    after = proc_status(pid)
    return {"attack": f"{SLOW_CONNECTIONS} connections each asking for three large replies and never reading",
            "seconds_connected": round(ended_at - connected_at, 1),
            "seconds_connecting": round(connected_at - started, 1), "connect_or_send_failed": dict(refused),
            "rss_before_mb": round(before["VmRSS"], 1), "rss_at_end_of_attack_mb": round(rss_during, 1),
            "rss_peak_mb": round(after["VmHWM"], 1) if exact_peak else None,
            "attack_connections_still_open": still_open,
            **watch.summary("status_while_attackers_connect", "status_once_connected")}


def _open(s: socket.socket) -> bool:
    """Whether the daemon still holds this connection: drain what it sent, then EOF means it hung up."""
    try:
        s.setblocking(False)
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


# -- main ---------------------------------------------------------------------------------


def run(seconds: float) -> dict[str, Any]:
    """Each attack on a fresh daemon (same workspace and index), so one's leftovers do not blur the next."""
    work = Path(tempfile.mkdtemp(prefix="cmatk", dir="/tmp"))
    try:
        ws = make_workspace(work)
        results: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "workspace": {"big_file_bytes": (ws / "memory" / "big.md").stat().st_size, "line_bytes": LINE_BYTES},
        }
        attacks: dict[str, Callable[[int, Path], dict[str, Any]]] = {
            "batch200": lambda pid, sock: batch_attack(pid, sock, 200, seconds),
            "batch64": lambda pid, sock: batch_attack(pid, sock, 64, seconds),
            "slow_readers": lambda pid, sock: slow_reader_attack(pid, sock, seconds),
        }
        results["index_build"] = with_daemon(ws, work, lambda pid, sock: {})  # later daemons start from it
        for name, attack in attacks.items():
            results[name] = with_daemon(ws, work, attack)
            print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
        # A daemon that has just built its index starts from more memory: the worst case.
        results["slow_readers_on_a_daemon_that_just_indexed"] = with_daemon(
            ws, work, attacks["slow_readers"], index=work / "fresh.sqlite")
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def with_daemon(ws: Path, work: Path, attack: Callable[[int, Path], dict[str, Any]],
                index: Path | None = None) -> dict[str, Any]:
    """Start a daemon, run one attack on it, then check it still answers and how much memory it kept."""
    sock = work / "d.sock"
    proc = spawn(ws, sock, index or work / "index.sqlite")
    try:
        wait_ready(proc, sock)
        result = {"idle_rss_mb": round(proc_status(proc.pid)["VmRSS"], 1), **attack(proc.pid, sock)}
        result["status_after"] = "answered" if "result" in call_once(sock, "status") else "error"
        result["rss_after_mb"] = round(proc_status(proc.pid)["VmRSS"], 1)
        result["model_process_rss_mb"] = round(sum(proc_status(child)["VmRSS"] for child in children(proc.pid)), 1)
        result["daemon_alive"] = proc.poll() is None
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def children(pid: int) -> list[int]:
    """The daemon's child processes (the local model's, when it runs one)."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each attack")
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    parser.add_argument("--provider", choices=("none", "local"), default="none",
                        help="the daemons' embedding provider (local: the default model)")
    parser.add_argument("--model-in-process", action="store_true",
                        help="load the local model in the daemon itself (embedding.isolate_local = false)")
    args = parser.parse_args()
    PROVIDER.update(name=args.provider, isolate=not args.model_in_process)
    results = run(args.seconds)
    results["provider"] = dict(PROVIDER)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
