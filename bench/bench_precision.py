"""Vector search at float32 and float16 below the cells (sign-bit candidates, then exact rescoring), and file size.

What `embedding.precision = "auto"` (float16 past 512 dimensions) costs where most indexes live: below
CELL_MIN vectors, where candidates come from sqlite-vec's sign bits and the exact rescoring runs in
sqlite-vec at float32 but in numpy at float16. Two indexes of N chunks with the same clustered
unit vectors (a topic centre plus noise, cosine ~0.8 to it), one per precision; each round asks the
same queries of both, alternately, through `Store.vectors.search` (24 rows, what a default search
asks for) and `Store.vectors.distances_of` (the hybrid side's lookups), and reports p50/p95 in ms, how
many top-10 answers are the same at both precisions, and the file sizes after a checkpoint. (Recall on
real data: bench_quality.py and docs/benchmarks.md; these vectors are synthetic, for timing.)

    .venv/bin/python bench/bench_precision.py --size 20000 --dims 1536 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from clawmem_index.embeddings.base import pack
from clawmem_index.index.store import Store

TOPICS = 200


def vectors(n: int, dims: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((TOPICS, dims)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    noise = rng.standard_normal((n, dims)).astype(np.float32) / np.sqrt(dims) * 0.75
    out = centres[rng.integers(0, TOPICS, n)] + noise
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def build(path: Path, data: np.ndarray, precision: str) -> Store:
    store = Store(path)
    store.vectors.ensure(data.shape[1], precision)
    store.cache.set_vector_owner("bench", "m", "k")
    with store.transaction():
        seqs = [store.insert_chunk(id=f"c{i}", path=f"memory/n{i // 4}.md", source="memory", start_line=i % 4 + 1,
                                   end_line=i % 4 + 1, hash=f"h{i}", text=f"chunk {i}", fts_text=f"chunk {i}")
                for i in range(len(data))]
        store.embeddings.store_vectors([(seq, f"h{i}", pack(data[i].tolist())) for i, seq in enumerate(seqs)], "m")
    store.vectors.build_index()
    store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store


def timed(call, queries: list[bytes]) -> list[float]:
    out = []
    for query in queries:
        started = time.perf_counter()
        call(query)
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=20_000)
    parser.add_argument("--dims", type=int, default=1536)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = vectors(args.size, args.dims, 1)
    queries = vectors(args.queries, args.dims, 2)
    blobs = [pack(q.tolist()) for q in queries]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.size} chunks of {args.dims} dims")
    with tempfile.TemporaryDirectory() as work:
        stores = {p: build(Path(work) / f"{p}.sqlite", data, p) for p in ("float32", "float16")}
        answers = {}
        for precision, store in stores.items():
            answers[precision] = [[(h.path, h.start_line) for h in store.vectors.search(b, 10)] for b in blobs]
            size = (Path(work) / f"{precision}.sqlite").stat().st_size
            print(f"{precision}: file {size / 1e6:.1f} MB, method {store.vectors.method()}")
        same = sum(a == b for a, b in zip(answers["float32"], answers["float16"], strict=True))
        print(f"top-10 lists identical at both precisions: {same} of {len(blobs)}")
        some = [list(range(1, 61))] * len(blobs)
        for round_ in range(args.rounds):
            for precision, store in stores.items():
                search = timed(lambda b, s=store: s.vectors.search(b, 24), blobs)
                lookups = timed(lambda b, s=store: s.vectors.distances_of(b, some[0]), blobs)
                print(f"round {round_ + 1} {precision}: vector_search p50 {statistics.median(search):.2f} ms"
                      f" p95 {np.percentile(search, 95):.2f} ms; distances_of(60) p50"
                      f" {statistics.median(lookups):.2f} ms p95 {np.percentile(lookups, 95):.2f} ms")
        for store in stores.values():
            store.close()


if __name__ == "__main__":
    main()
