"""Keyword queries at scale through a running daemon: common-word phrases against rare words.

    python bench/bench_keyword_scale.py --notes 100000 [--work DIR] [--queries 200] [--out bench/out/keyword_scale.json]

A workspace of `--notes` generated notes (bench/generate.py; 100,000 notes make ~436,000 chunks) is
indexed keyword-only under --work (reused on the next run), then a real `clawmem serve` answers
`search` (mode bm25, the default answer size) over its Unix socket, one client, one request at a
time. Three query sets, each `--queries` long, drawn from the generator's own vocabulary:

- common: phrases of 3 of the most frequent content words ("staging deploy rollback"): BM25 scores
  every chunk holding any of them, the case the issue's 5 ms / 20 ms goal is about;
- mixed: 2 common words and one rare one;
- rare: a unique id the generator wrote once (a commit hash), which matches one chunk.

Reported per set: p50, p95 and max in ms, and how many results came back. `--warm-passes N` first
asks N other sets of the same kinds untimed (other draws, so the answer cache does not answer the
timed ones): the steady state of a daemon that keeps per-word scores between queries until the
index changes, not what the first query with a word costs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
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

from generate import WORDS, generate  # noqa: E402

COMMON = [w for w in WORDS[:40] if len(w) > 4]  # the domain words the generator uses most


def clean_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}, "CLAWMEM_PROVIDER": "none"}


def call(sock: socket.socket, reader: Any, params: dict[str, Any]) -> dict[str, Any]:
    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "search", "params": params}).encode() + b"\n")
    answer = json.loads(reader.readline())
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return dict(answer["result"])


def queries(workspace: Path, n: int, rng: random.Random) -> dict[str, list[str]]:
    ids: list[str] = []
    for path in sorted((workspace / "memory").rglob("*.md"))[:: max(1, n // 50)][: n * 2]:
        ids += re.findall(r"\bCommit ([0-9a-f]{7})\b", path.read_text())
    rng.shuffle(ids)
    return {
        "common": [" ".join(rng.sample(COMMON, 3)) for _ in range(n)],
        "mixed": [" ".join([*rng.sample(COMMON, 2), ids[i % len(ids)]]) for i in range(n)],
        "rare": [ids[i % len(ids)] for i in range(n)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "clawmem-keyword-scale")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "keyword_scale.json")
    parser.add_argument("--warm-passes", type=int, default=0, help="untimed passes over each set before timing it")
    args = parser.parse_args()
    workspace, index = args.work / f"ws{args.notes}", args.work / f"index{args.notes}.sqlite"
    if not workspace.exists():
        generate(workspace, args.notes)
    subprocess.run([sys.executable, "-m", "clawmem_index", "index", "--workspace", str(workspace),
                    "--index", str(index)], env=clean_env(), check=True, capture_output=True)
    status = subprocess.run([sys.executable, "-m", "clawmem_index", "status", "--json", "--workspace", str(workspace),
                             "--index", str(index)], env=clean_env(), check=True, capture_output=True, text=True)
    chunks = int(json.loads(status.stdout)["chunks_indexed"])
    sock_dir = Path(tempfile.mkdtemp(prefix="cmk", dir="/tmp"))
    path = sock_dir / "d.sock"
    daemon = subprocess.Popen([sys.executable, "-m", "clawmem_index", "serve", "--workspace", str(workspace), "--index",
                               str(index), "--socket", str(path)], env={**clean_env(), "CLAWMEM_LOG_LEVEL": "warning"},
                              stderr=subprocess.DEVNULL)
    results: dict[str, Any] = {"notes": args.notes, "chunks": chunks, "load_before": os.getloadavg()[0],
                               "warm_passes": args.warm_passes}
    try:
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
            reader = sock.makefile("rb")
            warm = [queries(workspace, args.queries, random.Random(8 + i)) for i in range(args.warm_passes)]
            for name, batch in queries(workspace, args.queries, random.Random(7)).items():
                for query in batch[:1] + [q for sets in warm for q in sets[name] if q not in batch]:  # warm
                    call(sock, reader, {"query": query, "mode": "bm25"})
                timings, found = [], []
                for query in batch:
                    started = time.perf_counter()
                    answer = call(sock, reader, {"query": query, "mode": "bm25"})
                    timings.append(time.perf_counter() - started)
                    found.append(len(answer["results"]))
                timings.sort()
                results[name] = {"p50_ms": round(statistics.median(timings) * 1000, 2),
                                 "p95_ms": round(timings[int(len(timings) * 0.95) - 1] * 1000, 2),
                                 "max_ms": round(timings[-1] * 1000, 2), "results_median": statistics.median(found),
                                 "example": batch[0]}
    finally:
        daemon.terminate()
        daemon.wait(60)
        shutil.rmtree(sock_dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
