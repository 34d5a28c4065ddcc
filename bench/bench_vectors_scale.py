"""Vector and hybrid search over a million chunks: the k-means cells (clawmem_index.index.vector_cells) at scale.

    python bench/bench_vectors_scale.py [--size 1000000] [--dims 384|1536] [--precision float32|float16]
                                        [--work DIR] [--rounds 3] [--compare]
                                        [--out bench/out/vectors-scale-<size>-<dims>[-float16].json]

Needs ../shared (the SciFact corpus and queries) and the MiniLM vectors of every SciFact sentence
and of the 300 test queries that `bench_vectors.py --sentences` caches under --work: 44,941 real
vectors. The index holds those, then noisy copies of them (cosine ~0.85 to their source, as in
bench_vectors.py) up to --size, each chunk with its sentence's text. --dims 1536 maps every vector
(and query) through one fixed random Gaussian projection: real vectors' neighbourhoods, kept
approximately, at the width of OpenAI's models (no 1,536-d model runs here).

Reports: the time to store the chunks and to build the cells (`Store.vectors.build_index`, what the end
of an embedding pass runs), the file's size and the bytes of its float vector table (`embedding.precision`
float16 stores them in half), recall@10 of `vectors.search` against exact cosine of the float32 vectors
(numpy) on the 300 queries, and p50/p95 of vector search (24 rows, what a default search asks
for), hybrid search and BM25 search through `run_search` on one long-lived Store, as the daemon
answers them (its keyword lists kept in a cache of the daemon's size, keyword_index.SHARED_POSTINGS,
and the cells it reads in one of vector_cells.SHARED_BYTES;
the median of --rounds passes, a first pass apart), the hybrid p50/p95 of that first pass (every query
new, no list kept at its start: what a daemon just started sees), and how many hybrid queries needed
a second, deeper vector read to prove their answer. With
--compare, a new index is also measured before its cells are built (sign bits in sqlite-vec, as
every index below 131,072 vectors is searched). An index file is reused by later runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_vectors import SHARED, FixedQueries, log, synthesize, timed  # noqa: E402

from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.index.keyword_index import SHARED_POSTINGS, PostingsCache  # noqa: E402
from clawmem_index.index.store import Store  # noqa: E402
from clawmem_index.index.vector_cells import SharedCells  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402


def corpus(work: Path) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
    vectors, queries = np.load(work / "scifact-sentences.npy"), np.load(work / "scifact-queries.npy")
    sentences = [s for doc in map(json.loads, (SHARED / "bench/scifact/corpus.jsonl").open())
                 for s in re.split(r"(?<=[.!?])\s+", doc["text"]) if len(s.split()) >= 6]
    test = {line.split("\t")[0] for line in (SHARED / "bench/scifact/qrels/test.tsv").read_text().splitlines()[1:]}
    texts = [q["text"] for q in map(json.loads, (SHARED / "bench/scifact/queries.jsonl").open()) if q["_id"] in test]
    assert len(sentences) == len(vectors), "the cached sentence vectors are not of this corpus"
    return vectors, sentences, queries, texts[:len(queries)]


def vector_reads(store: Store, search: Callable[[int], object], n: int) -> dict[str, int]:
    """How many hybrid queries proved their answer on the first vector read, and how many read deeper
    (a second search of the vector index: thousands of candidates more)."""
    calls = 0
    real = store.vectors.search

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    store.vectors.search = counted  # type: ignore[method-assign]
    reads: dict[str, int] = {}
    try:
        for i in range(n):
            calls = 0
            search(i)
            key = "one read" if calls <= 1 else "deeper reads"
            reads[key] = reads.get(key, 0) + 1
    finally:
        del store.vectors.search
    return reads


def widen(vectors: np.ndarray, dims: int) -> np.ndarray:
    if dims == vectors.shape[1]:
        return vectors
    projection = np.random.default_rng(11).standard_normal((vectors.shape[1], dims)).astype(np.float32)
    out = np.empty((len(vectors), dims), dtype=np.float32)
    for i in range(0, len(vectors), 65_536):
        part = vectors[i:i + 65_536] @ projection
        out[i:i + 65_536] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return out


def build(path: Path, vectors: np.ndarray, sentences: list[str], precision: str,
          before: Callable[[Store], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The index; `before` measures it with the sign bits alone, before the embedding pass's end makes cells."""
    started = time.perf_counter()
    store = Store(path, fast_unsafe=True)
    store.vectors.ensure(vectors.shape[1], precision)
    for start in range(0, len(vectors), 5000):
        with store.transaction():
            for i in range(start, min(start + 5000, len(vectors))):
                text = sentences[i % len(sentences)]
                seq = store.insert_chunk(id=f"c{i}", path=f"memory/n{i // 2000}/{i % 2000}.md", source="memory",
                                         start_line=1, end_line=1, hash=f"h{i}", text=text, fts_text=text)
                store.embeddings.store_vector(seq, vectors[i].tobytes(), "bench")
    stored = time.perf_counter() - started
    figures: dict[str, Any] = {"store_s": round(stored, 1)}
    if before:
        figures["before_cells"] = before(store)
        log(f"before the cells: {figures['before_cells']}")
    started = time.perf_counter()
    store.vectors.build_index()
    figures["cells_s"] = round(time.perf_counter() - started, 1)
    store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--precision", choices=("float32", "float16"), default="float32")
    parser.add_argument("--work", default="/tmp/clawmem-bench-vectors")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", action="store_true",
                        help="also measure a new index with its sign bits alone (before the cells)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = Path(args.work)
    real, sentences, queries, texts = corpus(work)
    vectors = widen(synthesize(real, args.size), args.dims)
    queries = widen(queries, args.dims)
    name = f"{args.size}-{args.dims}" + ("" if args.precision == "float32" else f"-{args.precision}")
    path = work / f"scale-{name}.sqlite"
    result: dict[str, Any] = {"size": args.size, "dims": args.dims, "precision": args.precision}
    sims = queries @ vectors.T
    kth = -np.sort(-sims, axis=1)[:, 9]
    blobs = [q.tobytes() for q in queries]
    n = len(queries)

    def vector_figures(store: Store) -> dict[str, Any]:
        seqs = np.array([row[0] for row in store.execute(f"SELECT rowid FROM {store.vectors.table()} ORDER BY rowid")])
        position = {int(s): i for i, s in enumerate(seqs)}
        found = sum(1 for qi in range(n) for h in store.vectors.search(blobs[qi], 10)
                    if sims[qi, position[h.seq]] >= kth[qi] - 1e-6)
        return {"method": store.vectors.method(), "recall@10": round(found / (10 * n), 4),
                "vector_24": timed(lambda i: store.vectors.search(blobs[i], 24), n, args.rounds,
                                   tail=0.95, warm_passes=1)}

    if not path.exists():
        result["build"] = build(path, vectors, sentences, args.precision, vector_figures if args.compare else None)
        log(f"built: {result['build']}")
    result["file_bytes"] = path.stat().st_size + sum(p.stat().st_size for p in path.parent.glob(path.name + "-*"))
    store = Store(path, create=False, keyword_postings=PostingsCache(SHARED_POSTINGS),
                  shared_cells=SharedCells())  # as a daemon's reader
    result["vector_table_bytes"] = store.execute("SELECT sum(pgsize) FROM dbstat WHERE name = ?",
                                                 (store.vectors.table(),))[0][0]
    result.update(vector_figures(store))
    log(f"{result['method']}: recall@10 {result['recall@10']}, vector {result['vector_24']}")
    settings = load_settings(workspace=work, overrides={"index": str(work / "unused.sqlite")}, environ={}).search
    provider = FixedQueries(texts, queries)
    result["hybrid_first_pass"] = timed(lambda i: run_search(store, provider, SearchRequest(texts[i]), settings), n, 1,
                                        tail=0.95, cold=True)
    result["hybrid"] = timed(lambda i: run_search(store, provider, SearchRequest(texts[i]), settings), n, args.rounds,
                             tail=0.95, warm_passes=1)
    result["bm25"] = timed(lambda i: run_search(store, None, SearchRequest(texts[i], mode="bm25"), settings),
                           n, args.rounds, tail=0.95, warm_passes=1)
    result["hybrid_vector_reads"] = vector_reads(store, lambda i: run_search(store, provider, SearchRequest(texts[i]),
                                                                           settings), n)
    store.close()
    out = Path(args.out or ROOT / "bench" / "out" / f"vectors-scale-{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
