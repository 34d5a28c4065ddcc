"""What an agent turn costs (issue 47): memory-core against memory-clawmem installed as the README says, through real
OpenClaw Gateway agent turns with a fake chat model on 127.0.0.1.

    PYTHONPATH=. python bench/bench_openclaw_turns.py [--notes 2001] [--rounds 3] [--turns 10] [--searches 30]
        [--modes keyword,hybrid] [--out bench/out/openclaw_turns.json] [--table OUT]

Each run: a fresh home whose ~/.openclaw/openclaw.json is a memory-core user's (a model, a workspace: a copy of one
generated flat workspace, generate.py --layout flat, with no index), the default plugin set; for memory-clawmem the
README's OpenClaw install lines are run as written in a copy of the checkout (their time is reported apart). The
Gateway is started and, the moment it is ready, the first agent turn is sent (POST /v1/chat/completions); the fake
model calls memory_search through OpenClaw's Tool Search bridge with a query taken from a note, then answers. Then
--turns more turns in the same session, each with another query. Reported per turn: its wall time, the plugin's own
`debug.toolMs` as the model was handed it, whether the search had results and whether it said it was partial or
unavailable. Once the index settled (no CPU in the Gateway's or the daemons' sessions for 2 s, no embedding request
for 2 s), --searches more searches through /tools/invoke give toolMs beside an unknown tool's round trip (the
Gateway's own floor). keyword: CLAWMEM_PROVIDER=none vs memory.search.provider "none"; hybrid: both embed through one
OpenAI-compatible server on 127.0.0.1 (hashed bag-of-words vectors, at once: the plugins' own work is measured).
The backends alternate in each round (the first swaps every round); /proc/loadavg is recorded before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "tests" / "integrations")]
from bench_openclaw import (  # noqa: E402
    Embedder, med, openclaw_at, proc_sum, queries, session_pids, sessions_of, settle)
from fake_chat import FakeModel, content_text, text, tool_call  # noqa: E402
from openclaw_host import (  # noqa: E402
    HOME, OpenClaw, free_port, gateway_section, started_gateway, stop_started_daemons)
from test_openclaw_turns import fresh_clone, readme_install_lines  # noqa: E402

BACKENDS = ("memory-clawmem", "memory-core")
ASK = re.compile(r"What do my notes say about (.+)\?")


def user_config(fake: FakeModel, ws: Path, port: int, token: str, mode: str, embed_url: str) -> dict[str, Any]:
    search: dict[str, Any] = {"provider": "none"}
    if mode == "hybrid":
        search = {"provider": "openai-compatible", "model": "all-MiniLM-L6-v2",
                  "remote": {"baseUrl": embed_url + "/", "apiKey": "bench"}}
    return {"gateway": gateway_section(port, token),
            "models": {"providers": {"fake": {"baseUrl": fake.base_url, "apiKey": "x", "api": "openai-completions",
                                              "models": [{"id": "fake-model", "name": "Fake", "contextWindow": 128000,
                                                          "maxTokens": 4096, "input": ["text"],
                                                          "reasoning": False}]}}},
            "agents": {"defaults": {"model": {"primary": "fake/fake-model"}, "workspace": str(ws)}},
            "memory": {"search": search}}


def scripted(fake: FakeModel) -> None:
    """The model: a turn's first request calls memory_search with the asked query; after the tool's answer, a reply."""
    def asked(body: dict[str, Any]) -> str | None:
        """The turn's question: the last user message that asks one (OpenClaw adds its own context messages after)."""
        for message in reversed(body.get("messages") or []):
            if message.get("role") == "assistant":
                return None
            if message.get("role") == "user" and (found := ASK.search(content_text(message.get("content")))):
                return found.group(1)
        return None

    fake.rule(lambda b: (b.get("messages") or [{}])[-1].get("role") == "tool", text("Noted."))
    fake.rule(lambda b: asked(b) is not None,
              lambda b: tool_call("tool_call", {"id": "memory_search", "args": {"query": asked(b)}}))


def details_in(content: str) -> dict[str, Any]:
    """The search's details as the model was handed them (the bridge may wrap them), {} when none are found."""
    try:
        value: Any = json.loads(content)
    except ValueError:
        return {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("results"), list):
                return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and item.lstrip().startswith("{"):
            try:
                stack.append(json.loads(item))
            except ValueError:
                pass
    return {}


def one_turn(gateway: Any, fake: FakeModel, query: str, session: str) -> dict[str, Any]:
    before = len(fake.requests)
    began = time.perf_counter()
    gateway.chat(f"What do my notes say about {query}?", user=session, timeout=600)
    took = (time.perf_counter() - began) * 1000
    handed = [content_text(m.get("content")) for body in fake.requests[before:] for m in body.get("messages") or []
              if m.get("role") == "tool"]
    details = details_in(handed[-1]) if handed else {}
    return {"turn_ms": round(took, 1), "tool_ms": details.get("debug", {}).get("toolMs"),
            "results": len(details.get("results") or []), "backend": details.get("debug", {}).get("backend"),
            "partial": bool(details.get("stale")), "unavailable": bool(
                details.get("unavailable") or details.get("disabled") or not details),
            "note": (details.get("warning") or details.get("error") or "")[:160] if details else
            (handed[-1] if handed else "no tool result")[:300]}


def turn_run(openclaw: OpenClaw, backend: str, mode: str, src: Path, work: Path, qs: list[str], turns: int,
             searches: int, embedder: Embedder) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix=f"turns-{backend[7:10]}-", dir=work))
    home, ws = run / "home", run / "home" / "agent"
    shutil.copytree(src, ws)
    runtime = Path(tempfile.mkdtemp(prefix="oct", dir="/tmp"))
    fake = FakeModel().start()
    scripted(fake)
    port, token = free_port(), secrets.token_hex(16)
    (home / ".openclaw").mkdir(parents=True)
    (home / ".openclaw" / "openclaw.json").write_text(
        json.dumps(user_config(fake, ws, port, token, mode, embedder.url), indent=2))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CLAWMEM_", "OPENCLAW_", "XDG_"))}
    env = openclaw.env({**base, "HOME": str(home), "TMPDIR": str(home), "XDG_RUNTIME_DIR": str(runtime),
                        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
                        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                        "CLAWMEM_PROVIDER": "none" if mode == "keyword" else "openai"})
    if mode == "hybrid":
        env.update(CLAWMEM_MODEL="all-MiniLM-L6-v2", OPENAI_BASE_URL=embedder.url, OPENAI_API_KEY="bench")
    env["PATH"] = f"{openclaw.cli.parent}{os.pathsep}{env['PATH']}"
    load = Path("/proc/loadavg").read_text().split()[:3]
    row: dict[str, Any] = {"backend": backend, "mode": mode, "loadavg": load}
    try:
        if backend == "memory-clawmem":
            clone = fresh_clone(run)
            began = time.monotonic()
            done = subprocess.run(["bash", "-c",
                                   "set -euo pipefail\n" + readme_install_lines() + '\necho "PATH=$PATH"\n'],
                                  cwd=clone, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"the README's install lines failed: {done.stderr[-2000:]}")
            row["install_s"] = round(time.monotonic() - began, 1)
            env["PATH"] = done.stdout.rsplit("PATH=", 1)[1].strip()
        began = time.monotonic()
        with started_gateway(openclaw, env, port, token, home / "gateway.log", 300) as gateway:
            row["gateway_start_s"] = round(time.monotonic() - began, 1)
            row["turns"] = [one_turn(gateway, fake, q, "bench") for q in qs[:turns + 1]]
            began, got = time.monotonic(), {}
            while not got.get("results") and time.monotonic() - began < 900:  # memory-core builds on a search
                status, body = gateway.invoke("memory_search", {"query": qs[0]}, "main", timeout=600)
                got = body.get("result", {}).get("details", {}) if status == 200 else {}
                if not got.get("results"):
                    time.sleep(2)
            row["until_results_after_turns_s"] = round(time.monotonic() - began, 1) if got.get("results") else None
            row["settled_s"] = settle(lambda: [gateway.process.pid, *sessions_of(home / ".cache")],
                                      embedder if mode == "hybrid" else None)
            tool_ms, floor, empty = [], [], 0
            for q in qs[turns + 1:turns + 1 + searches]:
                status, body = gateway.invoke("memory_search", {"query": q}, "main", timeout=600)
                details = body.get("result", {}).get("details", {}) if status == 200 else {}
                if "toolMs" in details.get("debug", {}):
                    tool_ms.append(float(details["debug"]["toolMs"]))
                empty += 0 if details.get("results") else 1
                row.setdefault("first_settled_answer", json.dumps(body)[:600])
                began = time.perf_counter()
                gateway.invoke("no_such_tool", {}, "main")
                floor.append((time.perf_counter() - began) * 1000)
            row.update(settled_tool_ms_p50=statistics.median(tool_ms) if tool_ms else None,
                       settled_searches=len(tool_ms), settled_no_results=empty,
                       unknown_tool_ms_p50=round(statistics.median(floor), 1),
                       rss_gateway_mb=round(proc_sum(session_pids(gateway.process.pid), "rss")),
                       rss_daemon_mb=round(proc_sum([p for s in sessions_of(home / ".cache") for p in session_pids(s)],
                                                    "rss")))
    finally:
        fake.stop()
        stop_started_daemons(home / ".cache")
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)
    return row


def table(out: dict[str, Any]) -> str:
    lines = ["| mode | backend | first turn ms | first search toolMs | first search had results | later turns ms (p50)"
             " | later toolMs (p50) | settled toolMs p50 | toolMs ratio clawmem/core (per round) | unknown tool ms |"
             " partial or unavailable answers | load (1 min) |", "|" + "---|" * 12]
    for mode in dict.fromkeys(r["mode"] for r in out["runs"]):
        rows = [r for r in out["runs"] if r["mode"] == mode]
        pairs: dict[int, dict[str, float]] = {r["round"]: {} for r in rows}
        for r in rows:
            if r.get("settled_tool_ms_p50"):
                pairs[r["round"]][r["backend"]] = r["settled_tool_ms_p50"]
        ratios = [round(p["memory-clawmem"] / p["memory-core"], 2) for p in pairs.values() if len(p) == 2]
        for backend in BACKENDS:
            rs = [r for r in rows if r["backend"] == backend]
            if not rs:
                continue
            later = [statistics.median([t["turn_ms"] for t in r["turns"][1:]] or [float("nan")]) for r in rs]
            later_tool = [statistics.median([t["tool_ms"] for t in r["turns"][1:] if t["tool_ms"] is not None] or
                                            [float("nan")]) for r in rs]
            cells = [med([r["turns"][0]["turn_ms"] for r in rs]),
                     med([float(r["turns"][0]["tool_ms"]) for r in rs if r["turns"][0]["tool_ms"] is not None]),
                     f"{sum(r['turns'][0]['results'] > 0 for r in rs)} of {len(rs)}", med(later), med(later_tool),
                     med([r["settled_tool_ms_p50"] for r in rs if r.get("settled_tool_ms_p50") is not None]),
                     ", ".join(map(str, ratios)) if backend == "memory-clawmem" else "",
                     med([r["unknown_tool_ms_p50"] for r in rs]),
                     str(sum(t["partial"] or t["unavailable"] for r in rs for t in r["turns"]))]
            lines.append(f"| {mode} | {backend} | {' | '.join(cells)} | {', '.join(r['loadavg'][0] for r in rs)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", type=int, default=2001)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=10, help="turns after the first")
    parser.add_argument("--searches", type=int, default=30)
    parser.add_argument("--modes", default="keyword,hybrid")
    parser.add_argument("--openclaw", type=Path, default=HOME, help="an OpenClaw install (installed here if absent)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-openclaw-turns")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "openclaw_turns.json")
    parser.add_argument("--table", type=Path, help="only print the table of an earlier --out file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    openclaw = openclaw_at(args.openclaw)
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / f"ws-{args.notes}"
    if not src.exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), str(src), str(args.notes),
                        "--layout", "flat"], check=True, timeout=600)
    qs = queries(src, args.turns + 1 + args.searches)
    out: dict[str, Any] = {"notes": args.notes, "runs": []}
    embedder = Embedder(real=False)
    try:
        for mode in [m for m in args.modes.split(",") if m]:
            for rnd in range(args.rounds):
                for backend in (BACKENDS if rnd % 2 == 0 else BACKENDS[::-1]):
                    row = {**turn_run(openclaw, backend, mode, src, args.work, qs, args.turns, args.searches,
                                      embedder), "round": rnd}
                    print(json.dumps(row), flush=True)
                    out["runs"].append(row)
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(out, indent=1))
    finally:
        embedder.close()
    print(table(out))


if __name__ == "__main__":
    main()
