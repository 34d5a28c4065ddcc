"""What the query-result cache saves: the same searches asked twice, through the engine as the daemon asks.

    python bench/bench_query_cache.py [--work DIR] [--model PATH.gguf] [--queries 100]

Uses the SciFact workspace and hybrid index bench_quality.py builds under --work (needs
../shared/bench the first time). Each query is asked once (a miss: the query is embedded and both
sides read) and again (a hit), then once more after a write to the index (a miss again: any
commit changes SQLite's data_version). Reports p50 / p95 in ms for each pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench_quality import SHARED, open_index, scifact_workspace  # noqa: E402

from clawmem_index.index.store import Store  # noqa: E402
from clawmem_index.search.ranking import SearchRequest  # noqa: E402


def timed(index, queries: list[str]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    took = []
    for query in queries:
        started = time.perf_counter()
        index.search(SearchRequest(query))
        took.append(1000 * (time.perf_counter() - started))
    took.sort()
    return {"p50_ms": round(statistics.median(took), 3), "p95_ms": round(took[int(0.95 * (len(took) - 1))], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/clawmem-quality"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    ws = scifact_workspace(args.work)
    index = open_index(ws, args.work / "scifact-local.sqlite", args.model, keyword_only=False)
    index.sync()
    with (SHARED / "bench" / "scifact" / "queries.jsonl").open() as fh:
        queries = [json.loads(line)["text"] for line in fh][: args.queries]
    index.provider.warm()  # type: ignore[union-attr]
    result = {"miss": timed(index, queries), "hit": timed(index, queries)}
    writer = Store(index.path, create=False)  # any commit, here a meta row, changes data_version
    writer.meta.set("bench_touch", str(time.time()))
    writer.close()
    result["after_a_write"] = timed(index, queries)
    result["load"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(result, indent=2))
    index.close()


if __name__ == "__main__":
    main()
