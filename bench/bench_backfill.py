"""Backfill benchmarks: a hybrid index against an instant provider, and a rebuild from the cache.

    python bench/bench_backfill.py [--notes 2001] [--reindex-notes 3003] [--dims 1536] [--latency 0]
                                   [--precision float32|float16] [--out bench/out/backfill.json]

An OpenAI-compatible embeddings server runs in its own process on 127.0.0.1 and answers at once
(`--latency` adds a fixed delay per request, to see what concurrency buys against a real service):
every vector it sends is the same precomputed base64 float32 unit vector, so the figures are
clawmem's cost, not the server's. Measured in process, with the real `openai` SDK:

- the keyword index of `--notes` generated notes (provider none), for scale;
- the hybrid index of the same notes (OpenAI provider, `--dims` dimensions, `--precision`), cold,
  and its state: bytes a chunk after a checkpoint, by table (`dbstat`), and the file against text +
  FTS + one float32 copy of the vectors (the issue's "state" ratio);
- `reindex` of `--reindex-notes` notes whose every vector is already in the embedding cache
  (every file read and chunked again), and that workspace's keyword index, for scale;
- a switch to another model and back: the rebuild back finds every vector in the cache and
  carries the chunks over from the index it replaces (no file read again).
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import random
import struct
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import generate  # noqa: E402


def serve(port_out: Any, dims: int, latency: float, hashed: bool = False) -> None:
    """The instant provider (runs in a child process): one precomputed vector for every input, or with
    `hashed` a vector made from each input's words (each word a fixed random direction: texts that
    share words are near, as a model's are), for a vector index whose cost depends on the data.
    Each text's vector is kept: a warm-up pass over the same texts leaves the timed one the cost of a
    lookup, as for the one vector."""
    rng = random.Random(1)
    raw = [rng.gauss(0, 1) for _ in range(dims)]
    norm = sum(x * x for x in raw) ** 0.5
    vector = base64.b64encode(struct.pack(f"<{dims}f", *(x / norm for x in raw))).decode()
    import hashlib
    import threading

    import numpy as np

    vocabulary: dict[str, int] = {}  # word -> its row of `directions`
    directions = np.zeros((4096, dims), dtype=np.float32)
    growing = threading.Lock()  # requests are served on threads of their own

    made: dict[str, str] = {}  # text -> its vector: a warm-up pass leaves the timed one only lookups

    def vector_of(text: str) -> str:
        nonlocal directions
        with growing:
            if text in made:
                return made[text]
            rows = []
            for word in text.lower().split():
                row = vocabulary.get(word)
                if row is None:
                    row = vocabulary[word] = len(vocabulary)
                    if row == len(directions):
                        directions = np.vstack([directions, np.zeros_like(directions)])
                    seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                    directions[row] = np.random.default_rng(seed).standard_normal(dims)
                rows.append(row)
            total = directions[rows].sum(axis=0) if rows else np.ones(dims, dtype=np.float32)
            size = float(np.linalg.norm(total))
            made[text] = base64.b64encode((total / size if size else total + 1.0).astype("<f4").tobytes()).decode()
            return made[text]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if latency:
                time.sleep(latency)
            items = ",".join(f'{{"object":"embedding","index":{i},'
                             f'"embedding":"{vector_of(text) if hashed else vector}"}}'
                             for i, text in enumerate(body["input"]))
            payload = (f'{{"object":"list","data":[{items}],"model":"{body["model"]}",'
                       '"usage":{"prompt_tokens":1,"total_tokens":1}}').encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    port_out.put(httpd.server_port)
    httpd.serve_forever()


def timed_sync(workspace: Path, index: Path, overrides: dict[str, Any], *, reindex: bool = False) -> dict[str, Any]:
    from clawmem_index.config import load_settings
    from clawmem_index.engine.core import MemoryIndex

    memory = MemoryIndex(load_settings(workspace=workspace, overrides={"index": str(index), **overrides}))
    started = time.perf_counter()
    report = memory.reindex() if reindex else memory.sync()
    seconds = time.perf_counter() - started
    memory.close()
    return {"seconds": round(seconds, 2), "chunks": report.chunks_added, "embedded": report.embedded,
            "from_cache": report.from_cache,
            "embed_error": report.embed_error}


def state(index: Path, dims: int) -> dict[str, Any]:
    """The index file's size after a checkpoint, by table, and against text + FTS + float32 vectors."""
    import apsw

    conn = apsw.Connection(str(index))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    tables = {str(name): int(size) for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")}
    chunks, text = conn.execute("SELECT count(*), sum(length(CAST(text AS BLOB))) FROM chunks").fetchone()
    conn.close()
    size = index.stat().st_size
    fts = sum(v for k, v in tables.items() if k.startswith("chunks_fts"))
    floats = int(chunks) * dims * 4

    def mb(*names: str, prefix: str = "") -> float:
        return round(sum(v for k, v in tables.items() if k in names or (prefix and k.startswith(prefix))) / 1e6, 1)

    return {"file_mb": round(size / 1e6, 1), "bytes_per_chunk": round(size / max(1, int(chunks))),
            "vectors_mb": mb("chunks_vec", "chunks_vec_half"), "sign_bits_mb": mb(prefix="chunks_vec_bits"),
            "chunks_mb": mb("chunks"), "fts_mb": round(fts / 1e6, 1), "cache_mb": mb("embedding_cache"),
            "over_text_fts_float32": round(size / (int(text or 0) + fts + floats), 2)}

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=2001)
    parser.add_argument("--reindex-notes", type=int, default=3003)
    parser.add_argument("--dims", type=int, default=1536)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--precision", choices=("float32", "float16"), default="float32")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "backfill.json")
    args = parser.parse_args()
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    ports: Any = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(ports, args.dims, args.latency), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    openai = {"embedding.provider": "openai", "embedding.base_url": url, "embedding.api_key": "sk-bench",
              "embedding.model": "text-embedding-3-small" if args.dims == 1536 else "bench-model",
              "embedding.precision": args.precision}
    from clawmem_index.text.tokens import get_encoding

    get_encoding()  # loaded once, as in a running daemon
    results: dict[str, Any] = {"notes": args.notes, "dims": args.dims, "latency_s": args.latency,
                               "precision": args.precision}
    try:
        with tempfile.TemporaryDirectory(prefix="clawmem-backfill-") as tmp:
            root = Path(tmp)
            workspace = generate(root / "ws", args.notes)
            results["keyword_index"] = timed_sync(workspace, root / "keyword.sqlite", {"embedding.provider": "none"})
            results["hybrid_index"] = timed_sync(workspace, root / "hybrid.sqlite", openai)
            results["hybrid_over_keyword"] = round(results["hybrid_index"]["seconds"]
                                                   / results["keyword_index"]["seconds"], 2)
            results["hybrid_state"] = state(root / "hybrid.sqlite", args.dims)
            big = generate(root / "big", args.reindex_notes, seed=11)
            results["reindex_cold_index"] = timed_sync(big, root / "big.sqlite", openai)
            results["reindex_from_cache"] = timed_sync(big, root / "big.sqlite", openai, reindex=True)
            results["reindex_keyword_index"] = timed_sync(big, root / "big-keyword.sqlite",
                                                          {"embedding.provider": "none"})
            other = {**openai, "embedding.model": "bench-other"}
            results["switch_to_other_model"] = timed_sync(big, root / "big.sqlite", other)
            results["switch_back_from_cache"] = timed_sync(big, root / "big.sqlite", openai)
    finally:
        server.terminate()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
