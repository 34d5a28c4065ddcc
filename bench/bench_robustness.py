"""Robustness benchmarks: a 5 MB line, and a daemon whose embedding provider hangs.

    python bench/bench_robustness.py [--out bench/out/robustness.json]

- Long line: `chunk_markdown` on one 5 MB line of several kinds (prose, one unbroken run,
  whitespace, base64, CJK), and a whole keyword sync of a workspace holding such a file.
- Hung provider: an OpenAI-compatible server on 127.0.0.1 answers embeddings while the index is
  built, then accepts every request and never replies. A real `clawmem serve` process (the real
  `openai` SDK, default timeouts and retries, default 2 s query deadline, debounce 0.3 s) keeps
  running against it. Measured: how long a new note takes to become keyword-searchable beyond the
  debounce (goal: within debounce + 1 s), hybrid search latency (goal: under the query deadline +
  100 ms), keyword search and `status` latency, all while the provider hangs.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import xxhash

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from generate import generate  # noqa: E402

DEBOUNCE = 0.3
DIMS = 64
LINE_BYTES = 5_000_000


# -- a 5 MB line --------------------------------------------------------------------------------


def long_lines() -> dict[str, str]:
    words = "memory staging server sqlite decision deploy alpha beta gamma delta".split()
    prose = " ".join(words[i * 7 % len(words)] for i in range(LINE_BYTES // 6))[:LINE_BYTES]
    return {
        "prose": prose,
        "one-run": "x" * LINE_BYTES,
        "whitespace": " " * (LINE_BYTES - 1) + "x",
        "base64": base64.b64encode(os.urandom(LINE_BYTES * 3 // 4)).decode(),
        "cjk": "记忆系统" * (LINE_BYTES // 12),
    }


def bench_long_line(tmp: Path) -> dict[str, Any]:
    from clawmem_index.config import load_settings
    from clawmem_index.engine.core import MemoryIndex
    from clawmem_index.text.chunking import chunk_markdown
    from clawmem_index.text.tokens import get_encoding

    get_encoding()
    out: dict[str, Any] = {"chunk_s": {}}
    for kind, line in long_lines().items():
        started = time.perf_counter()
        chunks = chunk_markdown(line)
        out["chunk_s"][kind] = {"seconds": round(time.perf_counter() - started, 2), "chunks": len(chunks),
                                "mb": round(len(line.encode()) / 1e6, 1)}
    workspace = tmp / "longline"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "memory" / "dump.md").write_text(long_lines()["prose"] + "\n")
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp / "longline.sqlite"),
                                                             "embedding.provider": "none"})
    started = time.perf_counter()
    MemoryIndex(settings).sync()
    out["keyword_sync_s"] = round(time.perf_counter() - started, 2)
    return out


# -- a provider that hangs ----------------------------------------------------------------------


class Provider:
    """OpenAI-compatible embeddings on 127.0.0.1 that answer until `hang` is set, then never again."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.closing = threading.Event()
        self.requests = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                provider.requests += 1
                if provider.hang.is_set():
                    provider.closing.wait()  # accepted, read, never answered
                    return
                data = [{"object": "embedding", "index": i, "embedding": _vector(text, body.get("dimensions") or DIMS,
                                                                                 body.get("encoding_format"))}
                        for i, text in enumerate(body["input"])]
                payload = json.dumps({"object": "list", "data": data, "model": body["model"],
                                      "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}/v1"

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()


def _vector(text: str, dims: int, encoding: str | None) -> Any:
    seed = xxhash.xxh3_64_intdigest(text.encode())
    vector = [float(((seed >> (i % 60)) & 7) - 3.5) for i in range(dims)]
    return base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode() if encoding == "base64" else vector


def call(path: Path, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(120)
        s.connect(str(path))
        s.sendall(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode() + b"\n")
        answer = json.loads(s.makefile("rb").readline())
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return dict(answer["result"])


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1), "n": len(ordered)}


def bench_hung_provider(tmp: Path) -> dict[str, Any]:
    from clawmem_index.config import load_settings
    from clawmem_index.engine.core import MemoryIndex

    workspace = tmp / "ws"
    generate(workspace, 200, seed=7)
    index = tmp / "hung.sqlite"
    provider = Provider()
    config = tmp / "clawmem.toml"
    config.write_text(f'[embedding]\nprovider = "openai"\nbase_url = "{provider.url}"\napi_key = "sk-bench"\n'
                      f'dimensions = {DIMS}\n[daemon]\ndebounce = {DEBOUNCE}\nmax_delay = 2.0\nrescan_interval = 0\n')
    memory = MemoryIndex(load_settings(workspace=workspace, config_file=config, overrides={"index": str(index)}))
    report = memory.sync()  # vectors for everything while the provider still answers
    memory.close()
    provider.hang.set()
    provider.requests = 0

    sock = Path(tempfile.mkdtemp(prefix="cmb", dir="/tmp")) / "d.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
    daemon = subprocess.Popen([sys.executable, "-m", "clawmem_index", "serve", "--workspace", str(workspace),
                               "--config", str(config), "--index", str(index), "--socket", str(sock)],
                              env={**env, "CLAWMEM_LOG_LEVEL": "warning"}, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        call(sock, "sync", {"wait": True})
        # Hybrid searches embed the query: the hung provider gets them (and the embedder's batch).
        hybrid = [timed(lambda: call(sock, "search", {"query": f"staging decision {n}"})) for n in range(20)]
        keyword = [timed(lambda: call(sock, "search", {"query": "staging decision", "mode": "bm25"}))
                   for _ in range(50)]
        status = [timed(lambda: call(sock, "status")) for _ in range(20)]
        fresh_note: list[float] = []
        for n in range(10):
            word = f"hungnote{n}xyz"
            written = time.perf_counter()
            (workspace / "memory" / f"new-{n}.md").write_text(f"# New\nA note about {word}.\n")
            while not call(sock, "search", {"query": word, "mode": "bm25"})["results"]:
                time.sleep(0.005)
            fresh_note.append(time.perf_counter() - written - DEBOUNCE)
        final = call(sock, "status")
    finally:
        daemon.terminate()
        daemon.wait(30)
        provider.close()
        shutil.rmtree(sock.parent, ignore_errors=True)
    return {
        "chunks": report.chunks_added, "embedded_before_the_hang": report.embedded,
        "provider_requests_while_hung": provider.requests,
        "hybrid_search_while_hung": summary(hybrid),
        "bm25_search_while_hung": summary(keyword),
        "status_while_hung": summary(status),
        "new_note_keyword_searchable_beyond_debounce": summary(fresh_note),
        "status_at_end": {k: final[k] for k in ("fresh", "pending_embeddings", "stale_reasons")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "robustness.json")
    args = parser.parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    with tempfile.TemporaryDirectory(prefix="clawmem-bench-") as tmp:
        results = {"long_line": bench_long_line(Path(tmp)), "hung_provider": bench_hung_provider(Path(tmp))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
