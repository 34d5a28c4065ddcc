"""Query-vector latency of the local model by thread count, quiet and under a CPU load of busy processes.

What `embedding.query_threads` (default 1) is chosen by: a query is a few tokens, and on a busy
machine llama.cpp threads of every core wait on each other. Each round embeds QUERIES queries on
1 thread and on all cores, alternately (the ratio taken in one sitting), and prints p50 and p95 in
ms with the load average before it.

    .venv/bin/python bench/bench_query_threads.py --model ../shared/models/all-MiniLM-L6-v2-q8_0.gguf \
        --load 0 --rounds 3
    .venv/bin/python bench/bench_query_threads.py --model ... --load 4 --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from pathlib import Path

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.local import LocalProvider

QUERIES = 60


def _burn(stop: multiprocessing.synchronize.Event) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _latencies(model: Path, query_threads: int) -> tuple[float, float]:
    provider = LocalProvider(EmbeddingSettings(query_threads=query_threads), model)
    provider.embed_query("warm the model up")
    times = []
    for i in range(QUERIES):
        started = time.perf_counter()
        provider.embed_query(f"what did we decide about the staging server {i}")
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * len(times)) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    try:
        cores = len(os.sched_getaffinity(0))
        for n in range(1, args.rounds + 1):
            load = Path("/proc/loadavg").read_text().split()[0]
            one, every = _latencies(args.model, 1), _latencies(args.model, 0)
            print(f"round {n} (+{args.load} busy, loadavg {load}): 1 thread p50 {one[0]:.1f} p95 {one[1]:.1f} ms;"
                  f" {cores} threads p50 {every[0]:.1f} p95 {every[1]:.1f} ms", flush=True)
    finally:
        stop.set()
        for burner in burners:
            burner.join()


if __name__ == "__main__":
    main()
