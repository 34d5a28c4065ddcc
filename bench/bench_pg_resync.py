"""The shared index's whole-pass costs at scale: a no-change sync, `status`, and the lost-rows check in them.

    .venv/bin/python bench/bench_pg_resync.py --notes 20000 --rounds 7

Generates a workspace (`bench/generate.py`), starts a local PostgreSQL with pgvector (tests/pg_server.py),
indexes it cold keyword-only, runs VACUUM ANALYZE, then times in each round (a fresh MemoryIndex each,
as one `clawmem index` / `clawmem status` run would): a sync with nothing changed, `status()` read-only,
and `PgStore.damage()` alone. Prints the median and range in ms and the load average before each round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pg_server  # noqa: E402
import psycopg  # noqa: E402
from generate import generate  # noqa: E402

from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402


def _ms(work: object) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawmem-resync-") as tmp:
        workspace = generate(Path(tmp) / "ws", args.notes)
        server = pg_server.start(shared_buffers="128MB")
        try:
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE resync")
            url = server.url("resync")
            settings = load_settings(workspace=workspace, overrides={
                "index_backend": "postgres", "index_url": url, "embedding.provider": "none",
                "index": str(Path(tmp) / "unused.sqlite")})
            index = MemoryIndex(settings)
            cold = _ms(index.sync)
            index.close()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
                chunks = conn.execute("SELECT count(*) FROM cm_chunks").fetchone()[0]  # type: ignore[index]
            print(f"{args.notes:,} notes, {chunks:,} chunks; cold keyword index {cold / 1000:.1f} s", flush=True)
            rows: dict[str, list[float]] = {"no-change sync": [], "status": [], "damage() alone": []}
            for n in range(1, args.rounds + 1):
                load = Path("/proc/loadavg").read_text().split()[0]
                writer = MemoryIndex(settings)
                rows["no-change sync"].append(_ms(writer.sync))
                writer.close()
                reader = MemoryIndex(settings, read_only=True)
                rows["status"].append(_ms(reader.status))
                store = reader.reader()
                rows["damage() alone"].append(_ms(store.damage))
                reader.close()
                print(f"round {n} (loadavg {load}): " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in rows.items()),
                      flush=True)
            for name, times in rows.items():
                print(f"{name}: median {statistics.median(times):.1f} ms ({min(times):.1f}-{max(times):.1f})")
        finally:
            server.close()


if __name__ == "__main__":
    main()
