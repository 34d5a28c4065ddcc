"""In-place model switches on the shared index: a cold hybrid index, then switches between two models.

    python bench/bench_switch.py [--notes 20000] [--dims 384]

On the bundled PostgreSQL the tests use (`shared_buffers` 128 MB, PostgreSQL's default), one
workspace from `bench/generate.py` is indexed with model "a", then synced with "b", "a", "b" (the
same chunking, so each is a switch in place: the vectors of the live generation are replaced, from
the embedding cache once both models have been seen). The provider is clawmem's deterministic
FakeProvider (vectors from each text's hash, no model run), so the figures are clawmem's and the
backend's cost. Each line: the seconds `sync()` took, what it embedded and took from the cache,
and how searches reach the vectors afterwards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import pg_server  # noqa: E402
import psycopg  # noqa: E402
from generate import generate  # noqa: E402

from clawmem_index.config import load_settings  # noqa: E402
from clawmem_index.embeddings.fake import FakeProvider  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=20000)
    parser.add_argument("--dims", type=int, default=384)
    args = parser.parse_args()
    server = pg_server.start(shared_buffers="128MB")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workspace = generate(Path(tmp) / "ws", args.notes, seed=0)
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE switches")
            overrides = {"index_backend": "postgres", "index_url": server.url("switches")}
            for step, model in enumerate(("a", "b", "a", "b")):
                index = MemoryIndex(load_settings(workspace=workspace, overrides=overrides),
                                    provider=FakeProvider(dims=args.dims, model=model))
                try:
                    started = time.perf_counter()
                    report = index.sync()
                    took = time.perf_counter() - started
                    kind = "cold index" if step == 0 else "switch in place"
                    print(f"{kind} to model {model}: {took:.2f} s, embedded {report.embedded}, from the cache"
                          f" {report.from_cache}; searches: {index.reader().vectors.method()}", flush=True)
                finally:
                    index.close()
    finally:
        server.close()


if __name__ == "__main__":
    main()
