"""pgvector HNSW graph parameters on real vectors: build time and recall@10 against the exact order.

    python bench/bench_hnsw.py [--params 16:64,16:32,12:48,12:32,8:32] [--ef 100,48] [--k 10] [--work DIR]
                               [--model PATH.gguf]

The vectors are every sentence (6+ words) of the SciFact abstracts (~45k) and the 300 SciFact test
queries, embedded with the shared MiniLM model (~8 minutes on 2 cores the first time, cached under
--work; bench_vectors.py makes and reads the same cache). Each graph is built on the bundled
PostgreSQL the tests use (`maintenance_work_mem` 1 GB, its default parallel workers), then every
query is searched at each `hnsw.ef_search` in --ef (clawmem asks at least 100) and compared with
the exact top k (numpy; 10 unless --k), with the median time a search took (one client, the server
warm). Chose the shared index's graph parameters (clawmem_index/index/pg/schema.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import pg_server  # noqa: E402
import psycopg  # noqa: E402
from bench_vectors import SHARED, query_set, sentence_vectors  # noqa: E402


def literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7f}" for x in vector) + "]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="16:64,16:32,12:48,12:32,8:32", help="m:ef_construction, comma-separated")
    parser.add_argument("--ef", default="100,48", help="hnsw.ef_search values to search with")
    parser.add_argument("--k", type=int, default=10, help="how many nearest each search asks for")
    parser.add_argument("--work", default="/tmp/clawmem-bench-vectors")
    parser.add_argument("--model", default=str(SHARED / "models/all-MiniLM-L6-v2-q8_0.gguf"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = sentence_vectors(work, args.model)
    queries, _, kind = query_set(work, args.model, data, 300)
    k = args.k
    exact = [set(np.argsort(-(data @ q), kind="stable")[:k].tolist()) for q in queries]
    print(f"{len(data)} vectors ({data.shape[1]}-d), {len(queries)} queries ({kind})", flush=True)
    server = pg_server.start(shared_buffers="128MB")
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute(f"CREATE TABLE v(id bigint PRIMARY KEY, e vector({data.shape[1]}))")
            with conn.cursor().copy("COPY v FROM STDIN") as copy:
                for i, row in enumerate(data):
                    copy.write_row((i, literal(row)))
            conn.execute("VACUUM ANALYZE v")
            conn.execute("SET maintenance_work_mem = '1GB'")
            print("| m | ef_construction | build | " + " | ".join(f"recall@{k}, p50, ef_search {ef}" for ef in
                                                                   args.ef.split(",")) + " |", flush=True)
            for pair in args.params.split(","):
                m, ef_construction = (int(x) for x in pair.split(":"))
                conn.execute("DROP INDEX IF EXISTS v_hnsw")
                started = time.perf_counter()
                conn.execute(f"CREATE INDEX v_hnsw ON v USING hnsw (e vector_cosine_ops)"
                             f" WITH (m = {m}, ef_construction = {ef_construction})")
                build = time.perf_counter() - started
                recalls = []
                for ef in args.ef.split(","):
                    conn.execute(f"SET hnsw.ef_search = {int(ef)}")
                    found, took = 0, []
                    for q, want in zip(queries, exact, strict=True):
                        started = time.perf_counter()
                        rows = conn.execute("SELECT id FROM v ORDER BY e <=> %s::vector LIMIT %s",
                                            (literal(q), k)).fetchall()
                        took.append(time.perf_counter() - started)
                        found += len(want & {r[0] for r in rows})
                    recalls.append(f"{found / (k * len(queries)):.3f}, {1000 * float(np.median(took)):.1f} ms")
                print(f"| {m} | {ef_construction} | {build:.1f} s | " + " | ".join(recalls) + " |", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
