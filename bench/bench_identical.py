"""Identical chunks: a file of one line repeated, indexed cold, and what it delays in a running daemon.

    python bench/bench_identical.py [--sizes 2,8,32] [--delay-mb 16] [--runs 3] [--out bench/out/identical.json]

- Scaling: a workspace holding one file of the same line repeated to N MB (every chunk the same
  text) and a small note, indexed keyword-only in a fresh process per run (`clawmem index`, process
  start included). Linear work shows as seconds growing with the size, not its square.
- Delay: a real `clawmem serve` (debounce 0.3 s) is given a 16 MB such file, and right after it an
  unrelated note; measured is how long that note takes to become keyword-searchable beyond the
  debounce, while the big file is indexed.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_robustness import call  # noqa: E402  (the same one-request socket client)

DEBOUNCE = 0.3
LINE = "the same line again, as a log that repeats itself\n"


def same_lines(megabytes: float) -> str:
    return LINE * int(megabytes * 1_000_000 // len(LINE))


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}


def bench_scaling(tmp: Path, megabytes: float, runs: int) -> dict[str, Any]:
    workspace = tmp / f"ws-{megabytes}"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "same.md").write_text(same_lines(megabytes))
    (workspace / "memory" / "note.md").write_text("an unrelated note about herons\n")
    seconds: list[float] = []
    for run in range(runs):
        index = tmp / f"index-{megabytes}-{run}.sqlite"
        load = Path("/proc/loadavg").read_text().split()[0]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "clawmem_index", "index", "--workspace", str(workspace),
                        "--index", str(index), "--provider", "none"], env=clean_env(), check=True, capture_output=True)
        seconds.append(time.perf_counter() - started)
        print(f"  {megabytes} MB run {run + 1}: {seconds[-1]:.2f} s (load {load})", file=sys.stderr)
        index.unlink()
    return {"megabytes": megabytes, "seconds": [round(s, 2) for s in seconds],
            "median_s": round(statistics.median(seconds), 2)}


def bench_delay(tmp: Path, megabytes: float, run: int) -> dict[str, Any]:
    tmp = tmp / f"delay-{run}"
    workspace = tmp / "daemon-ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Memory\nThe staging server is pinecone.\n")
    config = tmp / "daemon.toml"
    config.write_text(f"[embedding]\nprovider = \"none\"\n[daemon]\ndebounce = {DEBOUNCE}\nmax_delay = 2.0\n")
    sock = Path(tempfile.mkdtemp(prefix="cmi", dir="/tmp")) / "d.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "clawmem_index", "serve", "--workspace", str(workspace),
                               "--config", str(config), "--index", str(tmp / "daemon.sqlite"), "--socket", str(sock)],
                              env={**clean_env(), "CLAWMEM_LOG_LEVEL": "warning"}, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        call(sock, "sync", {"wait": True})
        (workspace / "memory" / "same.md").write_text(same_lines(megabytes))
        time.sleep(DEBOUNCE + 0.2)  # the big file's sync has started
        written = time.perf_counter()
        (workspace / "memory" / "heron.md").write_text("# Herons\nA note about grey herons.\n")
        while not call(sock, "search", {"query": "herons", "mode": "bm25"})["results"]:
            time.sleep(0.01)
        note = time.perf_counter() - written - DEBOUNCE
        while call(sock, "status")["pending_files"]:
            time.sleep(0.1)
        big = time.perf_counter() - written
    finally:
        daemon.terminate()
        daemon.wait(60)
        shutil.rmtree(sock.parent, ignore_errors=True)
    return {"megabytes": megabytes, "note_searchable_beyond_debounce_s": round(note, 2),
            "big_file_done_after_s": round(big, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,8,32")
    parser.add_argument("--delay-mb", type=float, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "identical.json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="clawmem-identical-") as tmp:
        results["scaling"] = [bench_scaling(Path(tmp), float(mb), args.runs) for mb in args.sizes.split(",")]
        results["delay"] = [bench_delay(Path(tmp), args.delay_mb, run) for run in range(args.runs)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
