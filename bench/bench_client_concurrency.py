"""Concurrent requests through one client against one client per request (issue 48, items 4-5).

    python bench/bench_client_concurrency.py [--files 20000] [--workspace DIR] [--index PATH] [--concurrency 4]
                                             [--batches 30] [--rounds 3] [--query-chars N]
                                             [--provider-delay S] [--out bench/out/client_concurrency.json]

A real daemon (`clawmem serve`, keyword-only) on a generated flat workspace. Each client sends --batches
batches of --concurrency searches at once (the Node client: Promise.all; the Python DaemonClient: a thread per
search, as `clawmem mcp`'s tool threads share one), each search 3 words, or with --query-chars that much text
of the notes (a search of many words costs more). With --provider-delay, hybrid searches against an
OpenAI-compatible server on 127.0.0.1 that answers each query vector after that long (the index's vectors are made
at full speed first): searches that wait, as a remote provider makes them, rather than compute. Compared: the same
batches through one shared client and through one new client per search. Reported: the wall time per batch,
median (p95) over the batches, per round, the ways alternating.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from clawmem_index.search.ranking import SearchRequest  # noqa: E402
from clawmem_index.service.client import DaemonClient  # noqa: E402

WORDS = ("agent memory index search deploy staging release branch review meeting decision database sqlite vector"
         " embedding latency budget customer invoice migration schema rollback incident alert config").split()

NODE = """
import { ClawmemClient } from %(client)s;
import { readFileSync } from "node:fs";
const [socketPath, mode, batchesFile] = process.argv.slice(2);
const batches = JSON.parse(readFileSync(batchesFile, "utf8"));
const shared = new ClawmemClient({ socketPath, timeoutMs: 60_000 });
const times = [];
for (const batch of batches) {
  const started = performance.now();
  await Promise.all(batch.map(async (q) => {
    const client = mode === "shared" ? shared : new ClawmemClient({ socketPath, timeoutMs: 60_000 });
    await client.search(q, { mode: process.env.BENCH_MODE });
    if (mode !== "shared") client.close();
  }));
  times.push(performance.now() - started);
}
shared.close();
console.log(JSON.stringify(times));
"""


def python_batches(socket: Path, mode: str, batches: list[list[str]], search_mode: str) -> list[float]:
    shared = DaemonClient(socket, timeout=60)
    times = []
    for batch in batches:
        def one(q: str) -> None:
            client = shared if mode == "shared" else DaemonClient(socket, timeout=60)
            client.search(SearchRequest(q, mode=search_mode))
            if client is not shared:
                client.close()
        threads = [threading.Thread(target=one, args=(q,)) for q in batch]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        times.append((time.perf_counter() - started) * 1000)
    shared.close()
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"p50_ms": round(statistics.median(ordered), 1), "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 1)}


def main() -> None:  # noqa: C901
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--workspace", type=Path, default=Path("/tmp/clawmem-reading-ws"))
    parser.add_argument("--index", type=Path, default=Path("/tmp/clawmem-query-cost.sqlite"))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--provider-delay", type=float, default=0.0,
                        help="hybrid searches against an embedding server on 127.0.0.1 that takes this long (s)")
    parser.add_argument("--query-chars", type=int, default=0,
                        help="each query this much text of the notes (a heavier search) instead of 3 words")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "client_concurrency.json")
    args = parser.parse_args()
    if not (args.workspace / "memory").is_dir():
        subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), str(args.workspace), str(args.files),
                        "--layout", "flat"], check=True)
    node = shutil.which("node")
    run = Path(tempfile.mkdtemp(prefix="ccb"))
    socket = run / "d.sock"
    env = {**os.environ, "CLAWMEM_PROVIDER": "none", "CLAWMEM_INDEX": str(args.index), "CLAWMEM_SOCKET": str(socket)}
    provider = None
    slow = threading.Event()
    if args.provider_delay:  # hybrid searches whose query vector takes that long: waiting, not computing
        from fake_http import FakeServer, openai_reply

        provider = FakeServer(lambda request: dataclasses.replace(
            openai_reply(request), delay=args.provider_delay if slow.is_set() else 0.0)).__enter__()
        env.update(CLAWMEM_PROVIDER="openai", CLAWMEM_INDEX=str(run / "index.sqlite"))
        (run / "clawmem.toml").write_text(f'[embedding]\nprovider = "openai"\nbase_url = "{provider.url}/v1"\n'
                                          'api_key = "sk-bench"\ndimensions = 8\n[search]\nquery_timeout = 30\n')
        env.update(NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    config = ["--config", str(run / "clawmem.toml")] if provider is not None else []
    daemon = subprocess.Popen([sys.executable, "-m", "clawmem_index", "serve", "--workspace", str(args.workspace),
                               *config],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with DaemonClient(socket, timeout=600) as probe:
                    probe.sync(wait=True)
                break
            except Exception:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError("the daemon did not start") from None
                time.sleep(0.2)
        if provider is not None:
            with DaemonClient(socket, timeout=600) as probe:
                deadline = time.monotonic() + 600
                while probe.status().get("pending_embeddings") and time.monotonic() < deadline:
                    time.sleep(0.5)  # the daemon's vectors, made at full speed before the provider slows down
            slow.set()
        rng = random.Random(48)
        notes = sorted((args.workspace / "memory").glob("*.md"))

        def query() -> str:
            if not args.query_chars:
                return " ".join(rng.sample(WORDS, 3))
            text = " ".join(rng.choice(notes).read_text(encoding="utf-8").split())
            while len(text) < args.query_chars:
                text += " " + " ".join(rng.choice(notes).read_text(encoding="utf-8").split())
            return text[:args.query_chars]

        def batches() -> list[list[str]]:  # new queries for every run: the daemon keeps answers it gave
            return [[query() for _ in range(args.concurrency)] for _ in range(args.batches)]
        script = run / "node_client.mjs"
        script.write_text(NODE % {"client": json.dumps(str(ROOT / "integrations" / "clawmem-client" / "index.js"))})
        search_mode = "hybrid" if provider is not None else "bm25"
        out: dict[str, Any] = {"files": args.files, "provider_delay": args.provider_delay, "search_mode": search_mode,
                               "concurrency": args.concurrency, "batches": args.batches,
                               "rows": []}
        for round_ in range(args.rounds):
            for mode in (("shared", "per-request") if round_ % 2 == 0 else ("per-request", "shared")):
                times = python_batches(socket, mode, batches(), search_mode)
                row = {"client": "python", "mode": mode, "round": round_, **summary(times)}
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
                if node is not None:
                    (run / "batches.json").write_text(json.dumps(batches()))
                    done = subprocess.run([node, str(script), str(socket), mode, str(run / "batches.json")],
                                          capture_output=True, text=True, timeout=600, check=True,
                                          env={**os.environ, "BENCH_MODE": search_mode})
                    row = {"client": "node", "mode": mode, "round": round_, **summary(json.loads(done.stdout))}
                    out["rows"].append(row)
                    print(json.dumps(row), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
    finally:
        daemon.terminate()
        daemon.wait(60)
        if provider is not None:
            provider.__exit__(None, None, None)
        shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    main()
