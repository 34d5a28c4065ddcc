"""What reading a query costs (typos, dates, quoted phrases) at scale, against the same search without them.

    python bench/bench_query_reading.py [--files 20000] [--workspace DIR] [--index PATH] [--rounds 3]
                                        [--out bench/out/query_reading.json]

A generated workspace (bench/generate.py, flat layout), indexed keyword-only, searched in-process by one
long-lived reader as a daemon's query thread is (kept postings, a vocabulary block read once per state
of the index). Four query sets of 200 each, from the corpus's own words: plain (2-3 words), the same
with one realistic typo in one word, with a date ("yesterday", "3 days ago", "on <Month> <day>"),
and with two of their words quoted as a phrase. Each set is searched with the new stages on (the
defaults) and off (`correct_typos` false, `date_weight` 0: the search of before), alternating per
round; p50 / p95 of each. The first pass of every set is a warm-up (a word's first use reads its
list: that cost is the same either way and measured elsewhere).
--postgres: the same on the shared index, a PostgreSQL started from its PyPI package (a database of its own), where
each vocabulary lookup a typo's reading makes is a round trip.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clawmem_index.config import load_settings, with_overrides  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402
from clawmem_index.text.spelling import NEIGHBOURS  # noqa: E402

WORDS = ("agent memory index search deploy staging release branch review meeting decision database sqlite vector"
         " embedding latency budget customer invoice migration schema rollback incident alert config token chunk"
         " project roadmap milestone blocker dependency upgrade server socket client timeout cache snapshot backup"
         " cluster replica partition tenant billing report dashboard metric summary research benchmark garden"
         " recipe travel flight hotel passport birthday doctor").split()


def typo(word: str) -> str:
    h = zlib.crc32(word.encode())
    i = 1 + h % (len(word) - 1)
    near = NEIGHBOURS.get(word[i], "")
    return word[:i] + near[(h >> 8) % len(near)] + word[i + 1:] if (h >> 4) % 2 and near else word[:i] + word[i + 1:]


def query_sets(rng: random.Random, n: int) -> dict[str, list[str]]:
    plain = [" ".join(rng.sample(WORDS, rng.randint(2, 3))) for _ in range(n)]
    dates = ["yesterday", "3 days ago", "on March 3", "last week", "two days ago", "on November 20"]
    return {
        "plain": plain,
        "one typo": [" ".join([typo(q.split()[0]), *q.split()[1:]]) for q in plain],
        "a date": [f"{q} {rng.choice(dates)}" for q in plain],
        "a quoted phrase": [f'"{" ".join(q.split()[:2])}" {" ".join(q.split()[2:])}'.strip() for q in plain],
    }


def shared_index() -> tuple[Any, dict[str, str]]:
    """A PostgreSQL started from its PyPI package (as the tests start it), and the settings of a database of it."""
    sys.path.insert(0, str(ROOT / "tests"))
    import pg_server
    import psycopg

    server = pg_server.start(shared_buffers="128MB")
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE query_reading")
    return server, {"index_backend": "postgres", "index_url": server.url("query_reading")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--workspace", type=Path, default=Path("/tmp/clawmem-reading-ws"))
    parser.add_argument("--index", type=Path, default=Path("/tmp/clawmem-reading.sqlite"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--postgres", action="store_true", help="the shared index (PostgreSQL) instead of SQLite")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "query_reading.json")
    args = parser.parse_args()
    if not (args.workspace / "memory").is_dir():
        subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), str(args.workspace), str(args.files),
                        "--layout", "flat"], check=True)
    server, where = shared_index() if args.postgres else (None, {"index": str(args.index)})
    settings = load_settings(workspace=args.workspace, overrides={**where, "embedding.provider": "none"}, environ={})
    index = MemoryIndex(settings, long_lived=True, pending_files=lambda: 0)
    started = time.perf_counter()
    index.sync()
    print(f"indexed in {time.perf_counter() - started:.1f} s: {index.status()['chunks_indexed']} chunks", flush=True)
    store = index.reader()
    on = settings.search
    off = with_overrides(settings, search={"correct_typos": False, "date_weight": 0.0}).search
    sets = query_sets(random.Random(41), args.queries)
    times: dict[str, dict[str, list[float]]] = {name: {"on": [], "off": []} for name in sets}
    for queries in sets.values():  # warm-up: every word's list read once
        for q in queries:
            for tuned in (on, off):
                run_search(store, None, SearchRequest(q, mode="bm25", now="2026-11-28"), tuned)
    for round_ in range(args.rounds):
        for name, queries in sets.items():
            for label, tuned in (("on", on), ("off", off)) if round_ % 2 == 0 else (("off", off), ("on", on)):
                for q in queries:
                    t = time.perf_counter()
                    run_search(store, None, SearchRequest(q, mode="bm25", now="2026-11-28"), tuned)
                    times[name][label].append(time.perf_counter() - t)
    out: dict[str, Any] = {"files": args.files, "chunks": index.status()["chunks_indexed"], "rounds": args.rounds}
    for name, by in times.items():
        row = {}
        for label, values in by.items():
            values.sort()
            row[label] = {"p50_ms": round(1000 * statistics.median(values), 3),
                          "p95_ms": round(1000 * values[int(0.95 * (len(values) - 1))], 3)}
        row["p95_ratio"] = round(row["on"]["p95_ms"] / row["off"]["p95_ms"], 2)
        out[name] = row
        print(name, json.dumps(row), flush=True)
    index.close()
    if server is not None:
        server.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
