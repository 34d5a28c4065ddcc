"""Retrieval quality on real data: BEIR SciFact and LoCoMo, for bm25, vector, hybrid weighted and rrf.

    python bench/bench_quality.py [--sets scifact,locomo] [--modes bm25,vector,weighted,rrf]
                                  [--model PATH.gguf] [--work DIR] [--out bench/out/quality.json]

Needs the evaluation data in ../shared/bench (never copied into this repository). Workspaces and
indexes are written under --work and reused between runs (the index is incremental and the
embedding cache survives), so a second run costs only the queries.

SciFact: each document becomes memory/<_id>.md ("# title", blank line, text); a document's score
is its best chunk's; nDCG@10 and recall@100 over the 300 test queries.
LoCoMo: each conversation is its own workspace (bench/locomo/locomo_to_workspace.py); a chunk is
relevant when its line range covers an evidence line; per question: recall@k of evidence lines
covered by the top k chunks, hit@k, MRR@20; by category and overall.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))

from clawmem_index.config import Settings, load_settings, with_overrides  # noqa: E402
from clawmem_index.engine import MemoryIndex  # noqa: E402
from clawmem_index.search import SearchRequest, run_search  # noqa: E402
from clawmem_index.workspace import file_date  # noqa: E402

MODES = {
    "bm25": {"mode": "bm25"},
    "vector": {"mode": "vector"},
    "weighted": {"mode": "hybrid", "fusion": "weighted"},
    "rrf": {"mode": "hybrid", "fusion": "rrf"},
}


SEARCH_OVERRIDES: dict[str, Any] = {}


def open_index(workspace: Path, index: Path, model: str | None, mode: str) -> MemoryIndex:
    provider = "none" if mode == "bm25" else "local"
    overrides: dict[str, Any] = {"index": str(index), "embedding.provider": provider}
    if model and provider == "local":
        overrides["embedding.local_model"] = model
    settings: Settings = load_settings(workspace=workspace, overrides=overrides, environ={})
    search = {k: v for k, v in MODES[mode].items() if k != "mode"}
    settings = with_overrides(settings, search={**search, **SEARCH_OVERRIDES, "min_score": 0.0})
    return MemoryIndex(settings, pending_files=lambda: 0)  # queries timed without the freshness scan


def build(workspace: Path, index: Path, model: str | None, mode: str, log: Callable[[str], None]) -> MemoryIndex:
    memory = open_index(workspace, index, model, mode)
    started = time.perf_counter()
    report = memory.sync()
    if report.changed or report.embedded:
        log(f"  indexed {workspace.name} ({'keyword' if mode == 'bm25' else 'local'}): {report.added} files, "
            f"{report.embedded} embedded in {time.perf_counter() - started:.1f}s")
    if report.embed_error:
        raise SystemExit(f"embedding failed: {report.embed_error}")
    return memory


# -- SciFact -------------------------------------------------------------------------------------

def scifact_workspace(work: Path) -> Path:
    ws = work / "scifact"
    marker = ws / ".complete"
    if marker.exists():
        return ws
    (ws / "memory").mkdir(parents=True, exist_ok=True)
    with (SHARED / "bench" / "scifact" / "corpus.jsonl").open() as fh:
        for line in fh:
            doc = json.loads(line)
            (ws / "memory" / f"{doc['_id']}.md").write_text(f"# {doc['title']}\n\n{doc['text']}\n")
    marker.write_text("")
    return ws


def ndcg_at_10(ranked: list[str], relevant: dict[str, int]) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:10]))
    ideal = sorted(relevant.values(), reverse=True)[:10]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def run_scifact(work: Path, modes: list[str], model: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    ws = scifact_workspace(work)
    queries = {}
    with (SHARED / "bench" / "scifact" / "queries.jsonl").open() as fh:
        for line in fh:
            q = json.loads(line)
            queries[q["_id"]] = q["text"]
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    with (SHARED / "bench" / "scifact" / "qrels" / "test.tsv").open() as fh:
        next(fh)
        for line in fh:
            qid, doc, score = line.split()
            qrels[qid][doc] = int(score)
    results: dict[str, Any] = {}
    for mode in modes:
        index_path = work / ("scifact-bm25.sqlite" if mode == "bm25" else "scifact-local.sqlite")
        memory = build(ws, index_path, model, mode, log)
        ndcgs, recalls, latencies = [], [], []
        for qid, relevant in qrels.items():
            started = time.perf_counter()
            answer = memory.search(SearchRequest(queries[qid], max_results=300, min_score=0.0, mode=MODES[mode]["mode"]))
            latencies.append(time.perf_counter() - started)
            ranked: list[str] = []
            for r in answer["results"]:  # type: ignore[union-attr]
                doc = Path(r["path"]).stem
                if doc not in ranked:
                    ranked.append(doc)
            ndcgs.append(ndcg_at_10(ranked, relevant))
            recalls.append(len(set(ranked[:100]) & relevant.keys()) / len(relevant))
        results[mode] = {"ndcg@10": round(statistics.mean(ndcgs), 4), "recall@100": round(statistics.mean(recalls), 4),
                         "queries": len(ndcgs), "query_ms_median": round(1000 * statistics.median(latencies), 1)}
        log(f"  scifact {mode}: {results[mode]}")
        memory.close()
    return results


# -- LoCoMo --------------------------------------------------------------------------------------

def locomo_workspaces(work: Path) -> Path:
    out = work / "locomo"
    if not (out / "qrels.jsonl").exists():
        subprocess.run([sys.executable, str(SHARED / "bench" / "locomo" / "locomo_to_workspace.py"),
                        str(SHARED / "bench" / "locomo" / "locomo10.json"), str(out)], check=True,
                       capture_output=True)
    return out


def evidence_date(q: dict[str, Any]) -> dt.date | None:
    """The date of the daily file holding a question's first evidence line (the session it happened in)."""
    days = sorted(file_date(e["file"]) or "" for e in q["expected"])
    return dt.date.fromisoformat(days[0]) if days and days[0] else None


def run_locomo(work: Path, modes: list[str], model: str | None, log: Callable[[str], None],
               half_life: float = 0.0, window: int | None = None) -> dict[str, Any]:
    """`half_life`: recency decay (days) counted from the conversation's last session; `window`: only
    temporal questions, each searched within +/- `window` days of its evidence's date (an oracle
    window: how much a right `since`/`before` helps, not how to find one)."""
    root = locomo_workspaces(work)
    questions = [json.loads(line) for line in (root / "qrels.jsonl").open()]
    questions = [q for q in questions if q["expected"]]
    if window is not None:
        questions = [q for q in questions if q["category_name"] == "temporal" and evidence_date(q)]
    by_ws: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for q in questions:
        by_ws[q["workspace"]].append(q)
    results: dict[str, Any] = {}
    for mode in modes:
        per_cat: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for name, qs in sorted(by_ws.items()):
            index_path = work / f"locomo-{name}-{'bm25' if mode == 'bm25' else 'local'}.sqlite"
            memory = build(root / name, index_path, model, mode, log)
            search = with_overrides(memory.settings, search={"decay_half_life_days": half_life}).search
            last_day = max(filter(None, (file_date(p.name) for p in (root / name / "memory").glob("*.md"))))
            provider = memory.provider if mode != "bm25" else None
            for q in qs:
                bounds: dict[str, str] = {}
                if window is not None:
                    day = evidence_date(q)
                    assert day is not None
                    bounds = {"since": (day - dt.timedelta(days=window)).isoformat(),
                              "before": (day + dt.timedelta(days=window + 1)).isoformat()}
                request = SearchRequest(q["question"], max_results=20, min_score=0.0, mode=MODES[mode]["mode"],
                                        **bounds)
                outcome = run_search(memory.reader(), provider, request, search,
                                     today=dt.date.fromisoformat(last_day))
                hits = [r.as_dict() for r in outcome.results]
                expected = {(e["file"], e["line"]) for e in q["expected"]}

                def covered(k: int) -> set[tuple[str, int]]:
                    return {(f, line) for (f, line) in expected for r in hits[:k]  # type: ignore[index]
                            if r["path"] == f and r["start_line"] <= line <= r["end_line"]}

                first = next((i for i, r in enumerate(hits, start=1)  # type: ignore[arg-type]
                              if any(r["path"] == f and r["start_line"] <= line <= r["end_line"]
                                     for f, line in expected)), None)
                for cat in (q["category_name"], "overall"):
                    row = per_cat[cat]
                    row["recall@6"].append(len(covered(6)) / len(expected))
                    row["recall@20"].append(len(covered(20)) / len(expected))
                    row["hit@6"].append(1.0 if covered(6) else 0.0)
                    row["mrr@20"].append(1.0 / first if first else 0.0)
            memory.close()
        results[mode] = {cat: {m: round(statistics.mean(v), 4) for m, v in row.items()} | {"n": len(row["mrr@20"])}
                         for cat, row in sorted(per_cat.items())}
        log(f"  locomo {mode}: overall {results[mode]['overall']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="scifact,locomo")
    parser.add_argument("--modes", default="bm25,vector,weighted,rrf")
    parser.add_argument("--model", default=None,
                        help="GGUF embedding model (default: clawmem's default local model, MiniLM converted to f16)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/clawmem-quality"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "quality.json")
    parser.add_argument("--vector-weight", type=float, help="weighted fusion: vector weight (text = 1 - it)")
    parser.add_argument("--decay", default="0", help="LoCoMo: recency half-lives to compare, days (0: off)")
    parser.add_argument("--windows", default="", help="LoCoMo temporal questions: +/- days around the evidence")
    args = parser.parse_args()
    if args.vector_weight is not None:
        SEARCH_OVERRIDES.update(vector_weight=args.vector_weight, text_weight=1.0 - args.vector_weight)
    if not (SHARED / "bench").is_dir():
        raise SystemExit("the evaluation data (../shared/bench) is not beside this project")
    args.work.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    out: dict[str, Any] = {"model": args.model, "search": SEARCH_OVERRIDES}
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    for name in args.sets.split(","):
        print(f"{name}:", flush=True)
        if name == "scifact":
            out[name] = run_scifact(args.work, modes, args.model, log)
            continue
        for half_life in map(float, args.decay.split(",")):
            key = name if not half_life else f"{name}-decay-{half_life:g}d"
            out[key] = run_locomo(args.work, modes, args.model, log, half_life=half_life)
        for window in (int(w) for w in args.windows.split(",") if w):
            out[f"{name}-temporal-window-{window}d"] = run_locomo(args.work, modes, args.model, log, window=window)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
