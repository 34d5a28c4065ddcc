"""Vector KNN: latency of the exact vec0 scan (schema 1) against the store's quantized KNN, and its recall.

    python bench/bench_vectors.py [--sizes 10000,100000] [--scifact INDEX] [--model PATH.gguf] [--sentences]
                                  [--work DIR] [--queries 300] [--rounds 3] [--out bench/out/vectors.json]

Recall is measured on REAL vectors: the chunk vectors of an existing SciFact index built with the
MiniLM model (opened read-only, never written) and the 300 SciFact test queries embedded with the
same model (without the model, sampled chunk vectors stand in and the report says so). recall@k
is the share of the exact top k (by brute-force cosine in numpy; ties count as found) that the
store returns, for several oversampling factors and for the configured one. With --sentences,
also at a larger scale: the chunk vectors plus every sentence of the SciFact abstracts (~45k)
embedded with the model (~10 minutes on 2 cores, cached under --work).

Latency uses indexes of N chunks written under --work (reused by later runs): the SciFact chunk
texts and vectors, and beyond those, SciFact vectors plus noise (cosine ~0.85 to their source).
Each index also gets a schema-1 style `vec0 float[dims] cosine` table: "exact" is the query
clawmem ran before (`embedding MATCH ? AND k = ?`, joined to chunks); "quantized" is
`Store.vectors.search`; "hybrid_search" is `run_search` (keyword + vector, default settings) with
the query vector precomputed, so the figure excludes embedding the query, and "bm25_search" its
keyword half alone. Each figure is the median over --rounds of a pass over the queries (the
machine may be shared: repeat, take medians).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import apsw
import numpy as np
import sqlite_vec

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))

import clawmem_index.index.vector_index as vector_index  # noqa: E402
from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.embeddings.base import ProviderBase, ProviderInfo  # noqa: E402
from clawmem_index.index.store import ChunkFilter, Store  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402

K = 24  # what a default search asks the store for: max_results 6 x candidate_multiplier 4
NOISE = 0.6


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- data ----------------------------------------------------------------------------------------

def read_scifact(index: Path) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Unit float32 vectors and (path, text) of every embedded chunk, read-only."""
    conn = apsw.Connection(f"file:{index}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    rows = conn.execute("SELECT c.path, c.text, v.embedding FROM chunks_vec AS v JOIN chunks AS c ON c.seq = v.rowid"
                        " ORDER BY c.seq").fetchall()
    conn.close()
    vectors = np.stack([np.frombuffer(blob, dtype=np.float32) for _, _, blob in rows])
    return vectors, [(str(path), str(text)) for path, text, _ in rows]


def query_set(work: Path, model: str | None, fallback: np.ndarray, n: int) -> tuple[np.ndarray, list[str], str]:
    """The SciFact test queries embedded with the local model (cached), or sampled chunk vectors without it."""
    test = {line.split("\t")[0] for line in (SHARED / "bench/scifact/qrels/test.tsv").read_text().splitlines()[1:]}
    texts = [q["text"] for q in map(json.loads, (SHARED / "bench/scifact/queries.jsonl").open()) if q["_id"] in test]
    cached = work / "scifact-queries.npy"
    if not cached.exists():
        try:
            from clawmem_index.config import EmbeddingSettings
            from clawmem_index.embeddings.base import normalize
            from clawmem_index.embeddings.local import LocalProvider

            path = Path(model) if model else Path.home() / ".cache/clawmem/models/all-MiniLM-L6-v2-f16.gguf"
            provider = LocalProvider(EmbeddingSettings(provider="local"), path)
            np.save(cached, np.array([normalize(v) for v in provider.embed_documents(texts)], dtype=np.float32))
        except Exception as exc:  # noqa: BLE001 - any failure means: no model here
            log(f"no query embeddings ({type(exc).__name__}: {exc}): sampled chunk vectors stand in")
            picked = np.random.default_rng(3).choice(len(fallback), size=min(n, len(fallback)), replace=False)
            return fallback[picked], [texts[i % len(texts)] for i in range(len(picked))], "chunk vectors"
    return np.load(cached)[:n], texts[:n], "SciFact test queries (MiniLM)"


def sentence_vectors(work: Path, model: str | None) -> np.ndarray:
    """Every sentence (6+ words) of the SciFact abstracts embedded with the local model, cached."""
    cached = work / "scifact-sentences.npy"
    if not cached.exists():
        from clawmem_index.config import EmbeddingSettings
        from clawmem_index.embeddings.base import normalize
        from clawmem_index.embeddings.local import LocalProvider

        sentences = [s for doc in map(json.loads, (SHARED / "bench/scifact/corpus.jsonl").open())
                     for s in re.split(r"(?<=[.!?])\s+", doc["text"]) if len(s.split()) >= 6]
        path = Path(model) if model else Path.home() / ".cache/clawmem/models/all-MiniLM-L6-v2-f16.gguf"
        provider = LocalProvider(EmbeddingSettings(provider="local"), path)
        vectors = [normalize(v) for i in range(0, len(sentences), 512)
                   for v in provider.embed_documents(sentences[i:i + 512])]
        np.save(cached, np.array(vectors, dtype=np.float32))
    return np.load(cached)


def real_recall(store: Store, vectors: np.ndarray, queries: np.ndarray, factors: list[int]) -> dict[str, Any]:
    """recall@10 and @24 by oversampling factor (no minimum), then recall@k as configured."""
    seqs = seqs_of(store)
    sweep: dict[str, dict[str, float]] = {}
    configured = (vector_index.OVERSAMPLE, vector_index.MIN_CANDIDATES)
    try:
        vector_index.MIN_CANDIDATES = 0
        for factor in factors:
            vector_index.OVERSAMPLE = factor
            sweep[str(factor)] = {f"recall@{k}": round(recall(store, vectors, seqs, queries, k), 4) for k in (10, 24)}
            log(f"  {len(vectors)} vectors, oversample {factor:>2} (no minimum): {sweep[str(factor)]}")
    finally:
        vector_index.OVERSAMPLE, vector_index.MIN_CANDIDATES = configured
    found = {f"recall@{k}": round(recall(store, vectors, seqs, queries, k), 4) for k in (6, 10, 24, 50)}
    log(f"  {len(vectors)} vectors, configured: {found}")
    return {"vectors": len(vectors), "by_oversample": sweep, "configured": found}


def synthesize(real: np.ndarray, n: int) -> np.ndarray:
    """The real vectors, then real vectors plus noise, renormalised, up to n."""
    rng = np.random.default_rng(7)
    extra = max(0, n - len(real))
    base = real[rng.integers(0, len(real), extra)]
    noise = rng.standard_normal(base.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    made = base + NOISE * noise
    made /= np.linalg.norm(made, axis=1, keepdims=True)
    return np.concatenate([real[:n], made.astype(np.float32)])


def build(path: Path, vectors: np.ndarray, chunks: Sequence[tuple[str, str]]) -> Store:
    """An index of len(vectors) chunks (reused when complete), plus the schema-1 exact table for comparison."""
    if path.exists():
        store = Store(path, create=False)
        if (store.meta.get("bench_chunks"), store.meta.get("vector_partitions")) == (
                str(len(vectors)), str(vector_index.VECTOR_PARTITIONS)):
            return store
        store.close()
        path.unlink()
    started = time.perf_counter()
    store = Store(path, fast_unsafe=True)
    dims = vectors.shape[1]
    store.vectors.ensure(dims)
    store.execute(f"CREATE VIRTUAL TABLE bench_exact USING vec0(embedding float[{dims}] distance_metric=cosine)")
    batch = 5000
    for start in range(0, len(vectors), batch):
        with store.transaction():
            for i in range(start, min(start + batch, len(vectors))):
                source_path, text = chunks[i % len(chunks)]
                path_i = source_path if i < len(chunks) else f"memory/copy{i // len(chunks)}/{Path(source_path).name}"
                seq = store.insert_chunk(id=f"c{i}", path=path_i, source="memory", start_line=1, end_line=1,
                                         hash=f"h{i}", text=text, fts_text=text)
                blob = vectors[i].tobytes()
                store.embeddings.store_vector(seq, blob, "bench")
                store.conn.execute("INSERT INTO bench_exact(rowid, embedding) VALUES(?, ?)", (seq, blob))
    store.meta.set("bench_chunks", str(len(vectors)))
    log(f"  built {path.name}: {len(vectors)} chunks in {time.perf_counter() - started:.0f}s")
    store.close()
    return Store(path, create=False)


# -- measurements ----------------------------------------------------------------------------------

def exact_hits(store: Store, query: bytes, k: int) -> list[tuple[Any, ...]]:
    """The schema-1 query: an exact KNN over a vec0 float table."""
    return store.execute(
        "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, v.distance FROM"
        " (SELECT rowid, distance FROM bench_exact WHERE embedding MATCH ? AND k = ?) AS v"
        " JOIN chunks AS c ON c.seq = v.rowid ORDER BY v.distance", (query, k))


def timed(fn: Callable[[int], object], n: int, rounds: int, *, tail: float = 0.99,
          warm_passes: int = 0, cold: bool = False) -> dict[str, float]:
    """p50 and the `tail` percentile in ms: per round over n queries, then the median of the rounds.

    Before the rounds: one call, or `warm_passes` whole passes (every word's list read once, the pages
    in); with `cold`, nothing (each query's first call is timed)."""
    for i in range(0 if cold else n * warm_passes or 1):
        fn(i % n)
    p50s, tails = [], []
    for _ in range(rounds):
        times = []
        for i in range(n):
            started = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - started)
        times.sort()
        p50s.append(statistics.median(times))
        tails.append(times[min(len(times) - 1, int(tail * len(times)))])
    return {"p50_ms": round(1000 * statistics.median(p50s), 2),
            f"p{round(100 * tail)}_ms": round(1000 * statistics.median(tails), 2)}


def recall(store: Store, vectors: np.ndarray, seqs: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Share of the exact top k returned (a tie with the k-th exact similarity counts as found)."""
    sims = queries @ vectors.T
    kth = -np.sort(-sims, axis=1)[:, k - 1]
    position = {int(s): i for i, s in enumerate(seqs)}
    found = 0
    for qi, query in enumerate(queries):
        hits = store.vectors.search(query.tobytes(), k)
        found += sum(1 for h in hits if sims[qi, position[h.seq]] >= kth[qi] - 1e-6)
    return found / (k * len(queries))


def seqs_of(store: Store) -> np.ndarray:
    return np.array([row[0] for row in store.execute("SELECT rowid FROM chunks_vec ORDER BY rowid")])


def prefixes(store: Store) -> list[tuple[str, float]]:
    """Path prefixes over all, a twelfth and about a hundredth of the chunks (copies live in memory/copyN/)."""
    total = store.counts()[1]
    found = []
    for prefix in ("memory/", "memory/copy1/", "memory/copy1/1"):
        rows = store.execute("SELECT count(*) FROM chunks WHERE substr(path, 1, ?) = ?", (len(prefix), prefix))[0][0]
        if rows:
            found.append((prefix, rows / total))
    return found


class FixedQueries(ProviderBase):
    """An embedding provider that answers queries with precomputed vectors (no model time in the figures)."""

    def __init__(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self._vectors = {text: [float(x) for x in vec] for text, vec in zip(texts, vectors, strict=True)}
        self.info = ProviderInfo("bench", "bench", int(vectors.shape[1]))

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._vectors[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vectors[text]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--scifact", default="/tmp/clawmem-quality/scifact-local.sqlite")
    parser.add_argument("--model", default=None)
    parser.add_argument("--work", default="/tmp/clawmem-bench-vectors")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--oversample", default="8,16,24,32,40,48,64")
    parser.add_argument("--sentences", action="store_true", help="also measure recall on ~53k real vectors")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "vectors.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    real, chunks = read_scifact(Path(args.scifact))
    queries, texts, query_kind = query_set(work, args.model, real, args.queries)
    log(f"SciFact: {len(real)} chunk vectors ({real.shape[1]}-d), {len(queries)} queries: {query_kind}")
    result: dict[str, Any] = {"k": K, "queries": query_kind, "partitions": vector_index.VECTOR_PARTITIONS,
                              "oversample": vector_index.OVERSAMPLE, "min_candidates": vector_index.MIN_CANDIDATES}

    factors = [int(x) for x in args.oversample.split(",")]
    real_sets = [("scifact_chunks", real)]
    if args.sentences:
        real_sets.append(("scifact_chunks_and_sentences", np.concatenate([real, sentence_vectors(work, args.model)])))
    result["recall_real"] = {}
    for name, vectors in real_sets:
        real_store = build(work / f"{name}.sqlite", vectors, chunks)
        result["recall_real"][name] = real_recall(real_store, vectors, queries, factors)
        real_store.close()

    settings = load_settings(workspace=work, overrides={"index": str(work / "unused.sqlite")}, environ={}).search
    provider = FixedQueries(texts, queries)
    sizes: dict[str, Any] = {}
    for n in (int(x) for x in args.sizes.split(",")):
        vectors = synthesize(real, n)
        store = build(work / f"vectors-{n}.sqlite", vectors, chunks)
        blobs = [q.tobytes() for q in queries]
        nq = len(blobs)
        figures: dict[str, Any] = {
            "method": store.vectors.method(),
            "exact": timed(lambda i: exact_hits(store, blobs[i], K), nq, args.rounds),
            "quantized": timed(lambda i: store.vectors.search(blobs[i], K), nq, args.rounds),
            "hybrid_search": timed(lambda i: run_search(store, provider, SearchRequest(texts[i]), settings),
                                   nq, args.rounds),
            "bm25_search": timed(lambda i: run_search(store, None, SearchRequest(texts[i], mode="bm25"), settings),
                                 nq, args.rounds),
            "quantized_with_prefix": {
                f"{prefix} ({share:.0%} of chunks)": timed(
                    lambda i, prefix=prefix: store.vectors.search(blobs[i], K, ChunkFilter(path_prefix=prefix)),
                    nq, args.rounds)
                for prefix, share in prefixes(store)},
            f"recall@{K}": round(recall(store, vectors, seqs_of(store), queries, K), 4),
        }
        sizes[str(n)] = figures
        log(f"  {n}: {json.dumps(figures)}")
        store.close()
    result["sizes"] = sizes
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
