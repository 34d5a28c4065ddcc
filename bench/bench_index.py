"""Index benchmarks (keyword-only): cold index, no-change resync, one-file edit, CLI commands (`index`, `status`,
`search` by phrase), size, RSS.

    python bench/bench_index.py [--sizes 200,2000,20000] [--out bench/out/index.json]

Workspaces come from bench/generate.py (~2 KB realistic Markdown files) under a temp dir. Each
measurement runs in a fresh subprocess, so figures include nothing cached by an earlier step
except the operating system's page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import generate  # noqa: E402

CHILD = """
import json, resource, statistics, sys, time
from pathlib import Path
t0 = time.perf_counter()
from clawmem_index.config import load_settings
from clawmem_index.engine.core import MemoryIndex
settings = load_settings(workspace=sys.argv[1], overrides={"index": sys.argv[2], "embedding.provider": "none"})
index = MemoryIndex(settings)
t1 = time.perf_counter()
report = index.sync()
t2 = time.perf_counter()
files, chunks = index.reader().counts()
result = {"sync_s": t2 - t1, "import_s": t1 - t0, "files": files, "chunks": chunks, "bytes_read": report.bytes_read,
          "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "workers_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
if sys.argv[3] == "warm":
    def timed(paths=None):
        start = time.perf_counter()
        index.sync(paths=paths)
        return time.perf_counter() - start
    result["nochange_s"] = statistics.median(timed() for _ in range(5))
    target = sorted((Path(sys.argv[1]).resolve() / "memory").rglob("*.md"))[0]
    original = target.read_text()
    edits = []
    for i in range(7):
        target.write_text(original + f"\\n- edit number {i} for the benchmark\\n")
        edits.append(timed())
    key = str(target.relative_to(Path(sys.argv[1]).resolve()))
    targeted = []
    for i in range(7):
        target.write_text(original + f"\\n- targeted edit {i}\\n")
        targeted.append(timed([key]))
    target.write_text(original)
    index.sync()
    result["edit_s"] = statistics.median(edits)
    result["edit_targeted_s"] = statistics.median(targeted)
    result["maxrss_after_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def child_sync(ws: Path, idx: Path, mode: str = "cold") -> dict[str, float]:
    """The child's figures, plus `tree_peak_mb`: the largest sum of RSS over the child and its descendants
    (chunking workers, multiprocessing's resource tracker), sampled every 20 ms."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(ws), str(idx), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, sum(_rss_mb(pid) for pid in _tree(proc.pid)))
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the benchmark's child failed: {err}")
    return {**json.loads(out), "tree_peak_mb": peak}


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants, whichever of their threads started them (Linux /proc)."""
    found = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [p for child in children.read().split() for p in _tree(int(child))]
    except OSError:
        pass
    return found


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0


# Phrases of the generated notes' words, rare to common: "postgres" matches nothing, "commit" half the chunks.
CLI_PHRASES = ("postgres", "meeting index memory", "staging deploy rollback", "commit 4f2a")
CLI_RUNS = 5


def cli(ws: Path, idx: Path, *args: str) -> float:
    """Seconds a `clawmem` command takes from the shell, process start included (keyword-only, no daemon)."""
    script = Path(sys.executable).with_name("clawmem")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "clawmem_index"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CLAWMEM_PROVIDER="none", CLAWMEM_WORKSPACE=str(ws), CLAWMEM_INDEX=str(idx),
               CLAWMEM_SOCKET=str(idx.parent / "no-daemon.sock"))
    start = time.perf_counter()
    subprocess.run([*command, *args], capture_output=True, check=True, env=env)
    return time.perf_counter() - start


def cli_search(ws: Path, idx: Path, query: str) -> float:
    return cli(ws, idx, "search", "--mode", "bm25", "--json", query)


def bench(size: int, root: Path, layout: str = "folders") -> dict[str, object]:
    ws = root / (f"ws-{size}" if layout == "folders" else f"ws-{size}-{layout}")
    if not ws.exists():
        generate(ws, size, layout=layout)
    idx = root / f"idx-{size}" / "index.sqlite"
    shutil.rmtree(idx.parent, ignore_errors=True)
    total_bytes = sum(p.stat().st_size for p in ws.rglob("*.md"))

    cold = child_sync(ws, idx)
    warm = child_sync(ws, idx, "warm")
    target = sorted((ws / "memory").rglob("*.md"))[0]
    original = target.read_text()
    target.write_text(original + "\n- an edit seen by a fresh process\n")
    fresh_edit = child_sync(ws, idx)["sync_s"]
    target.write_text(original)
    child_sync(ws, idx)
    searches = [cli_search(ws, idx, "staging deploy rollback incident") for _ in range(7)]
    size_bytes = sum(p.stat().st_size for p in idx.parent.iterdir() if p.name.startswith("index.sqlite"))
    shell = {"cli_index_nochange_s": [cli(ws, idx, "index") for _ in range(CLI_RUNS)],
             "cli_status_s": [cli(ws, idx, "status") for _ in range(CLI_RUNS)],
             **{f"cli_search_s[{phrase}]": [cli_search(ws, idx, phrase) for _ in range(CLI_RUNS)]
                for phrase in CLI_PHRASES}}
    return {
        "files": size,
        "layout": layout,
        "mb": round(total_bytes / 1e6, 2),
        "chunks": cold["chunks"],
        "cold_index_s": round(cold["sync_s"], 3),
        "cold_mb_per_s": round(total_bytes / 1e6 / cold["sync_s"], 2),
        "cold_chunks_per_s": round(cold["chunks"] / cold["sync_s"]),
        "cold_peak_rss_mb": round(cold["maxrss_mb"], 1),
        "cold_worker_peak_rss_mb": round(cold["workers_maxrss_mb"], 1),
        "cold_tree_peak_rss_mb": round(cold["tree_peak_mb"], 1),
        "nochange_resync_s": round(warm["nochange_s"], 4),
        "one_edit_resync_s": round(warm["edit_s"], 4),
        "one_edit_targeted_s": round(warm["edit_targeted_s"], 4),
        "one_edit_fresh_process_s": round(fresh_edit, 3),
        "cli_search_s_median": round(statistics.median(searches), 3),
        "index_bytes_per_chunk": round(size_bytes / max(1, cold["chunks"])),
        **{name: f"{min(times):.2f}-{max(times):.2f}" for name, times in shell.items()},  # the range of CLI_RUNS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="200,2000,20000")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "clawmem-bench")
    parser.add_argument("--layout", choices=("folders", "flat"), default="folders",
                        help="flat: every note a daily log in memory/YYYY-MM-DD.md (OpenClaw's layout)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "index.json")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    rows = [bench(int(s), args.root, args.layout) for s in args.sizes.split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
