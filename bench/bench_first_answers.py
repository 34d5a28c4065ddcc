"""The first answers of a daemon started on a brand-new workspace (issue 47): how soon it answers, and with what.

    PYTHONPATH=. python bench/bench_first_answers.py [--notes 2001,20001] [--rounds 3] [--provider none]
        [--out bench/out/first_answers.json]

A flat workspace (generate.py --layout flat: MEMORY.md and memory/YYYY-MM-DD.md, OpenClaw's layout) with no index;
`clawmem serve` is started as the OpenClaw plugin starts it (its own process, the default settings, keyword-only
unless --provider says otherwise), and from the moment it is spawned a client polls the socket (a new connection
every 20 ms until one is accepted, then one search every 20 ms) with three searches in turn: a phrase of MEMORY.md,
the commit hash of the newest daily note, and the commit hash of the oldest one. Reported, in seconds from the
spawn: the first answer of any kind; the first answer holding MEMORY.md; the newest note; the oldest note (the last
the first pass reaches); the first answer that no longer says `first_pass` and has no pending files (the whole index).
Every answer given before the oldest note is in must say it is partial (`first_pass`, pending files and a
warning): the count of those that did not is reported too (it must be 0). Rounds alternate the sizes;
/proc/loadavg is recorded before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLAWMEM = Path(sys.executable).with_name("clawmem")
POLL_S = 0.02


def ask(sock: socket.socket, reader: Any, ident: int, query: str) -> dict[str, Any]:
    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": ident, "method": "search",
                             "params": {"query": query, "max_results": 6, "mode": "bm25"}}).encode() + b"\n")
    answer = json.loads(reader.readline())
    if "error" in answer:
        raise RuntimeError(answer["error"].get("message"))
    return answer["result"]


def targets(ws: Path) -> dict[str, tuple[str, str]]:
    """{what: (query, the path that answers it)}: a MEMORY.md phrase, the newest and the oldest note's commit."""
    notes = sorted((ws / "memory").glob("*.md"))
    lines = [ln for ln in (ws / "MEMORY.md").read_text().splitlines() if ln.startswith("- ")]
    words = re.findall(r"[A-Za-z]{6,}", lines[0])[:3]

    def commit(note: Path) -> str:
        found = re.search(r"Commit ([0-9a-f]{7})", note.read_text())
        if not found:
            raise SystemExit(f"{note} names no commit: generate the workspace with bench/generate.py")
        return found.group(1)

    return {"memory_md": (" ".join(words), "MEMORY.md"),
            "newest": (commit(notes[-1]), f"memory/{notes[-1].name}"),
            "oldest": (commit(notes[0]), f"memory/{notes[0].name}")}


def one_run(src: Path, work: Path, provider: str) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix="first-", dir=work))
    ws = run / "ws"
    shutil.copytree(src, ws)
    wanted = targets(ws)
    sock_dir = Path(tempfile.mkdtemp(prefix="cmf", dir="/tmp"))
    sock_path = sock_dir / "d.sock"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")},
           "XDG_CACHE_HOME": str(run / "cache"), "CLAWMEM_PROVIDER": provider}
    load = Path("/proc/loadavg").read_text().split()[:3]
    began = time.monotonic()
    daemon = subprocess.Popen([str(CLAWMEM), "serve", "--workspace", str(ws), "--socket", str(sock_path)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[str, float] = {}
    answers, marks = 0, []
    try:
        sock = None
        while sock is None:
            if daemon.poll() is not None:
                raise RuntimeError(f"clawmem serve exited {daemon.returncode}")
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(sock_path))
            except OSError:
                sock.close()
                sock = None
                time.sleep(POLL_S)
        reader = sock.makefile("rb")
        deadline = began + 1800
        order = list(wanted)
        while "complete" not in seen and time.monotonic() < deadline:
            for what in order:
                if what in seen:
                    continue
                query, path = wanted[what]
                answer = ask(sock, reader, answers + 1, query)
                at = time.monotonic() - began
                answers += 1
                seen.setdefault("first_answer", at)
                partial = bool(answer.get("first_pass")) or answer["index"].get("pending_files", 0) > 0
                marked = bool(answer.get("first_pass") and answer.get("warning")) or partial and bool(
                    answer.get("warning"))
                marks.append((at, marked))
                if any(r["path"] == path for r in answer["results"]):
                    seen[what] = at
                if not partial and "complete" not in seen:
                    seen["complete"] = at
                time.sleep(POLL_S)
            if all(what in seen for what in order) and "complete" not in seen:
                time.sleep(POLL_S)
                answer = ask(sock, reader, answers + 1, wanted["oldest"][0])
                answers += 1
                if not answer.get("first_pass") and answer["index"].get("pending_files", 0) == 0:
                    seen["complete"] = time.monotonic() - began
        sock.close()
        # An answer given before the oldest note was in claimed a whole index unless it said it was partial.
        unmarked = sum(1 for at, marked in marks if at < seen.get("oldest", float("inf")) and not marked)
    finally:
        daemon.terminate()
        daemon.wait(60)
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
    return {"loadavg": load, "answers": answers, "unmarked_first_pass_answers": unmarked,
            **{k: round(v, 2) for k, v in seen.items()}}


def med(values: list[float]) -> str:
    return f"{statistics.median(values):g} ({min(values):g}–{max(values):g})" if values else "—"


def table(out: dict[str, Any]) -> str:
    keys = ("first_answer", "memory_md", "newest", "oldest", "complete")
    lines = ["| notes | first answer s | MEMORY.md found s | newest note found s | oldest note found s |"
             " whole index s | unmarked partial answers | load (1 min) |", "|" + "---|" * 8]
    for notes in dict.fromkeys(r["notes"] for r in out["runs"]):
        rows = [r for r in out["runs"] if r["notes"] == notes]
        cells = [med([float(r[k]) for r in rows if k in r]) for k in keys]
        lines.append(f"| {notes:,} | {' | '.join(cells)} | {sum(r['unmarked_first_pass_answers'] for r in rows)} |"
                     f" {', '.join(r['loadavg'][0] for r in rows)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--notes", default="2001,20001")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--provider", default="none")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-first-answers")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "first_answers.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    sizes = [int(n) for n in args.notes.split(",")]
    sources = {}
    for n in sizes:
        sources[n] = args.work / f"ws-{n}"
        if not sources[n].exists():
            subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), str(sources[n]), str(n),
                            "--layout", "flat"], check=True, timeout=1200)
    out: dict[str, Any] = {"provider": args.provider, "runs": []}
    for rnd in range(args.rounds):
        for n in (sizes if rnd % 2 == 0 else sizes[::-1]):
            row = {"notes": n, "round": rnd, **one_run(sources[n], args.work, args.provider)}
            print(json.dumps(row), flush=True)
            out["runs"].append(row)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))
    print(table(out))


if __name__ == "__main__":
    main()
