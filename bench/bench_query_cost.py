"""What reading one query costs against its length, up to the socket's longest line (issue 48, items 1-2).

    python bench/bench_query_cost.py [--files 20000] [--workspace DIR] [--index PATH] [--rounds 3]
                                     [--give-up 2] [--postgres] [--out bench/out/query_cost.json]

A generated workspace (bench/generate.py, flat layout), indexed keyword-only, searched in-process by one
long-lived reader as a daemon's query thread is, with the defaults (typos read, dates read). Query shapes,
each repeated to a length of 100 B, 1 KB, 10 KB, 100 KB and 1 MB (the daemon's line limit is 1 MiB):
"March 3 " and "yesterday " (a date at every few characters), unknown words (64 distinct made-up words of
5-9 letters, then repeated: every one a candidate typo), and prose from the corpus's own words. Reported per
shape and length: the search's CPU seconds (this thread) and wall seconds, median of --rounds. A shape stops
growing once one query took more than --give-up seconds (the code before issue 48 is quadratic in dates).
--postgres: the same on the shared index, a PostgreSQL started from its PyPI package (a database of its own).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402

LENGTHS = (100, 1_000, 10_000, 100_000, 1_000_000)
PROSE = ("agent memory index search deploy staging release branch review meeting decision database sqlite vector"
         " embedding latency budget customer invoice migration schema rollback incident alert config token chunk")


def unknown_words(rng: random.Random) -> str:
    return " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 9))) for _ in range(64))


def shapes(rng: random.Random) -> dict[str, str]:
    return {"March 3": "March 3 ", "yesterday": "yesterday ", "unknown words": unknown_words(rng) + " ",
            "prose": PROSE + " "}


def at_length(unit: str, length: int) -> str:
    return (unit * (length // len(unit) + 1))[:length].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--workspace", type=Path, default=Path("/tmp/clawmem-reading-ws"))
    parser.add_argument("--index", type=Path, default=Path("/tmp/clawmem-query-cost.sqlite"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--give-up", type=float, default=2.0)
    parser.add_argument("--postgres", action="store_true", help="the shared index (PostgreSQL) instead of SQLite")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "query_cost.json")
    args = parser.parse_args()
    if not (args.workspace / "memory").is_dir():
        subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), str(args.workspace), str(args.files),
                        "--layout", "flat"], check=True)
    server = None
    where: dict[str, str] = {"index": str(args.index)}
    if args.postgres:  # the shared index: a PostgreSQL started from its PyPI package (as the tests start it)
        sys.path.insert(0, str(ROOT / "tests"))
        import pg_server

        import psycopg

        server = pg_server.start(shared_buffers="128MB")
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE query_cost")
        where = {"index_backend": "postgres", "index_url": server.url("query_cost")}
    settings = load_settings(workspace=args.workspace, overrides={**where, "embedding.provider": "none"}, environ={})
    index = MemoryIndex(settings, long_lived=True, pending_files=lambda: 0)
    index.sync()
    store = index.reader()
    run_search(store, None, SearchRequest(PROSE, mode="bm25", now="2026-11-28"), settings.search)  # warm-up
    out: dict[str, Any] = {"files": args.files, "chunks": index.status()["chunks_indexed"], "rounds": args.rounds,
                           "rows": []}
    for name, unit in shapes(random.Random(48)).items():
        for length in LENGTHS:
            query = at_length(unit, length)
            cpu, wall = [], []
            for _ in range(args.rounds):
                c, w = time.thread_time(), time.perf_counter()
                run_search(store, None, SearchRequest(query, mode="bm25", now="2026-11-28"), settings.search)
                cpu.append(time.thread_time() - c)
                wall.append(time.perf_counter() - w)
                if wall[-1] > args.give_up:
                    break
            row = {"shape": name, "chars": len(query), "cpu_s": round(statistics.median(cpu), 4),
                   "wall_s": round(statistics.median(wall), 4)}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            if max(wall) > args.give_up:
                break
    index.close()
    if server is not None:
        server.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
