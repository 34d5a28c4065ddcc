"""The cold paths of a search without a daemon: what a hybrid search costs beside a keyword one, and the pending check.

    python bench/bench_cold_paths.py [--notes 3 2001] [--rounds 10] [--dims 1536] [--pending-notes 20000]
                                     [--out bench/out/cold_paths.json]

1. For each `--notes` (OpenClaw's flat layout, `generate.py --layout flat`), a hybrid index is built against an
   instant OpenAI-compatible server on 127.0.0.1 (bench_backfill's, in its own process: its CPU is not counted).
   Then `clawmem search` runs as a user runs it, in rounds, keyword (`--mode bm25`) and hybrid in random order
   within each round: wall time and CPU time (user + system of the command's process, from its rusage). The
   figure is the per-round ratio of hybrid to keyword CPU, with a distribution-free 95 % interval for its median.
2. `--pending-notes` flat notes, a keyword index: fresh processes each measure the pending-files check of a
   search (`Freshness.query_pending_files`) and, on its own, a newest-first scan up to its first daily log: CPU
   milliseconds (process time), the check's own bound being 25 ms.

Python's bytecode is compiled first (as an installed package has it): a checkout run with PYTHONDONTWRITEBYTECODE
would otherwise compile every module on every command.
"""

from __future__ import annotations

import argparse
import compileall
import json
import multiprocessing
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_backfill import serve  # noqa: E402
from bench_qmd import median_interval  # noqa: E402
from generate import generate  # noqa: E402

QUERIES = ["rollback migration", "replica quorum", "tenant cluster dashboard", "backoff retry", "embedding latency"]
CLAWMEM = [sys.executable, "-m", "clawmem_index"]

_PENDING_PROBE = """
import sys, time
began = time.process_time()
from pathlib import Path
from clawmem_index.config import load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.sources.workspace import scan
imported = time.process_time()
walk = iter(scan(Path(sys.argv[1]), newest_first=True))
first = next(f for f in walk if f.path.startswith("memory/"))
to_first = time.process_time()
index = MemoryIndex(load_settings(workspace=sys.argv[1]), provider=None, read_only=True)
store = index.reader()
opened = time.process_time()
answer = index.freshness.query_pending_files(store)
done = time.process_time()
print(f"{(to_first - imported) * 1000:.2f} {(done - opened) * 1000:.2f} {first.path} "
      f"{answer.get('pending_files_complete', True)}")
"""


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command, its CPU from the rusage of its process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, timeout=300)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{argv}: exit {out.returncode}: {out.stderr[-400:]!r}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def hybrid_against_keyword(notes: int, rounds: int, dims: int, work: Path, port: int) -> dict[str, Any]:
    workspace = work / f"flat-{notes}"
    generate(workspace, notes, layout="flat") if notes > 3 else _small(workspace)
    (workspace / "clawmem.toml").write_text(
        f'[embedding]\nprovider = "openai"\nmodel = "bench-{dims}"\ndimensions = {dims}\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\napi_key = "bench"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAWMEM_", "OPENAI_", "OPENBLAS_"))}
    env.update(CLAWMEM_INDEX=str(work / f"flat-{notes}.sqlite"), CLAWMEM_SOCKET=str(work / "none.sock"),
               NO_PROXY="127.0.0.1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    run([*CLAWMEM, "index", "-w", str(workspace)], env)
    rng = random.Random(notes)
    rows = []
    for query in QUERIES:  # warm-up
        for mode in ("bm25", "hybrid"):
            run([*CLAWMEM, "search", "-w", str(workspace), "--mode", mode, query], env)
    for round_ in range(rounds):
        query = QUERIES[round_ % len(QUERIES)]
        modes = ["bm25", "hybrid"]
        rng.shuffle(modes)
        measured = {mode: run([*CLAWMEM, "search", "-w", str(workspace), "--mode", mode, query], env)
                    for mode in modes}
        row: dict[str, Any] = {"round": round_, "query": query, "load": os.getloadavg()[0]}
        for mode in modes:
            row[f"{mode}_wall"], row[f"{mode}_cpu"] = measured[mode]
        rows.append(row)
    ratios = [r["hybrid_cpu"] / r["bm25_cpu"] for r in rows]
    low, high = median_interval(ratios)
    return {"notes": notes, "rounds": rounds, "dims": dims,
            "bm25_cpu_s": statistics.median(r["bm25_cpu"] for r in rows),
            "hybrid_cpu_s": statistics.median(r["hybrid_cpu"] for r in rows),
            "bm25_wall_s": statistics.median(r["bm25_wall"] for r in rows),
            "hybrid_wall_s": statistics.median(r["hybrid_wall"] for r in rows),
            "cpu_ratio_median": statistics.median(ratios), "cpu_ratio_interval": [low, high],
            "load": [min(r["load"] for r in rows), max(r["load"] for r in rows)], "rows": rows}


def _small(workspace: Path) -> None:
    """Three files, as a new agent's workspace has."""
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / "MEMORY.md").write_text("# Memory\n\n- The staging server is called pinecone.\n"
                                         "- Rollback migrations go through the replica quorum first.\n")
    (workspace / "memory" / "2026-12-01.md").write_text("# 2026-12-01\n\n- Tenant cluster dashboard moved.\n")
    (workspace / "memory" / "2026-12-02.md").write_text("# 2026-12-02\n\n- Backoff retry for embedding latency.\n")


def pending_check(notes: int, runs: int, work: Path) -> dict[str, Any]:
    workspace = work / f"pending-{notes}"
    if not workspace.exists():
        generate(workspace, notes, layout="flat")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
    env.update(CLAWMEM_PROVIDER="none", CLAWMEM_INDEX=str(work / f"pending-{notes}.sqlite"),
               CLAWMEM_SOCKET=str(work / "none.sock"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    run([*CLAWMEM, "index", "-w", str(workspace)], env)
    first, check, complete = [], [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _PENDING_PROBE, str(workspace)], env=env, capture_output=True,
                             text=True, timeout=120, check=True)
        to_first, took, path, whole = out.stdout.split()
        first.append(float(to_first))
        check.append(float(took))
        complete.append(whole == "True")
    return {"notes": notes, "runs": runs, "to_first_daily_log_cpu_ms": statistics.median(first),
            "to_first_daily_log_cpu_ms_max": max(first), "check_cpu_ms": statistics.median(check),
            "check_cpu_ms_max": max(check), "checks_complete": sum(complete), "first": path}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, nargs="*", default=[3, 2001])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dims", type=int, default=1536)
    parser.add_argument("--pending-notes", type=int, default=20_000, help="0: skip the pending check")
    parser.add_argument("--pending-runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "cold_paths.json")
    args = parser.parse_args()
    compileall.compile_dir(str(HERE.parent / "clawmem_index"), quiet=1)
    result: dict[str, Any] = {"hybrid": [], "pending": None}
    with tempfile.TemporaryDirectory(prefix="clawmem-cold-") as tmp:
        work = Path(tmp)
        ports: Any = multiprocessing.Queue()
        server = multiprocessing.Process(target=serve, args=(ports, args.dims, 0.0, True), daemon=True)
        server.start()
        port = ports.get(timeout=30)
        try:
            for notes in args.notes:
                row = hybrid_against_keyword(notes, args.rounds, args.dims, work, port)
                result["hybrid"].append(row)
                print(f"{notes} notes: CPU bm25 {row['bm25_cpu_s']:.3f} s, hybrid {row['hybrid_cpu_s']:.3f} s, "
                      f"hybrid/bm25 {row['cpu_ratio_median']:.2f} [{row['cpu_ratio_interval'][0]:.2f}, "
                      f"{row['cpu_ratio_interval'][1]:.2f}]; wall {row['bm25_wall_s']:.3f} / "
                      f"{row['hybrid_wall_s']:.3f} s; load {row['load']}", flush=True)
        finally:
            server.terminate()
        if args.pending_notes:
            result["pending"] = pending_check(args.pending_notes, args.pending_runs, work)
            print(json.dumps(result["pending"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
