"""What the importance factor does to retrieval: nothing where no entry is rated, and what ratings do where some are.

    python bench/bench_importance.py [--work DIR] [--modes bm25,hybrid] [--share 0.3] [--out bench/out/importance.json]

OpenClaw's writers rate an entry `<!-- importance: N -->` (1-10) in the curated memory, and ranking multiplies a
chunk's score by 0.75 + 0.05 N (clawmem_index.search.boosts, memory-core's factor). On LoCoMo (1,982 evidence
questions, n = 6, defaults), three questions:

1. Where no entry is rated (LoCoMo as bench_quality.py indexes it: daily files), is every answer exactly what it is
   with the factor taken out (`importance_factor` patched to 1)? Counted per question, every result's path, lines
   and score compared (and, to show the comparison can see a difference, the same count where entries are rated).
2. The same on a curated layout: each conversation's turns as the `- ` entries of one MEMORY.md (the evidence lines
   mapped), no entry rated.
3. That curated layout with a share of its entries rated (`--share`, seeded): `random` (ratings 1-10 at random,
   unrelated to what is asked: the cost of noise) and `aligned` (the rated entries that are evidence for some
   question get 8-10, the others 1-10: what honest ratings can buy). Recall@6 against the unrated layout, paired
   per question with a 95% bootstrap interval.

Needs the evidence data in ../shared/bench (never copied into this repository).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import statistics
import sys
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_quality as quality  # noqa: E402

import clawmem_index.search.boosts as boosts  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402

_TURN = re.compile(r"^- ")


def curated(source: Path, target: Path) -> dict[tuple[str, int], int]:
    """`source`'s daily files as one MEMORY.md in `target` (a section per day, its turns the entries); the line each
    (file, line) of the source became."""
    target.mkdir(parents=True, exist_ok=True)
    lines: list[str] = ["# Memory", ""]
    where: dict[tuple[str, int], int] = {}
    for path in sorted((source / "memory").glob("*.md")):
        key = f"memory/{path.name}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            line = "## " + line[2:] if line.startswith("# ") else line  # the day's title: a section of MEMORY.md
            where[(key, number)] = len(lines) + 1
            lines.append(line)
        lines.append("")
    (target / "MEMORY.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return where


def rate(memory: Path, share: float, seed: int, evidence: set[int] | None) -> int:
    """Rate `share` of MEMORY.md's entries (seeded); `evidence`: the lines asked about, rated 8-10 when picked (None:
    every rating at random). Returns how many entries were rated."""
    picks, values = random.Random(seed), random.Random(seed + 1)  # the same entries rated in every variant
    lines = memory.read_text(encoding="utf-8").splitlines()
    rated = 0
    for i, line in enumerate(lines):
        if _TURN.match(line) and picks.random() < share:
            n = values.randint(8, 10) if evidence is not None and i + 1 in evidence else values.randint(1, 10)
            lines[i] = f"{line} <!-- importance: {n} -->"
            rated += 1
    memory.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rated


def answers(index: Any, provider: Any, mode: str, questions: list[dict[str, Any]], now: str | None,
            neutral: bool = False) -> list[list[dict[str, Any]]]:
    """Each question's results as dicts (`neutral`: with the importance factor taken out)."""
    kept = boosts.importance_factor
    if neutral:
        boosts.importance_factor = lambda importance: 1.0
    try:
        settings = index.settings.search
        return [[r.as_dict() for r in run_search(index.reader(), provider,
                                                 SearchRequest(q["question"], max_results=6, mode=mode, now=now),
                                                 settings).results] for q in questions]
    finally:
        boosts.importance_factor = kept


def recall(hits: list[dict[str, Any]], expected: set[tuple[str, int]]) -> float:
    return quality.locomo_scores(hits, expected)["recall@6"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "importance-work")
    parser.add_argument("--modes", default="bm25,hybrid")
    parser.add_argument("--share", type=float, default=0.3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "importance.json")
    args = parser.parse_args()
    root = quality.locomo_workspaces(args.work)
    questions = [q for q in map(json.loads, (root / "qrels.jsonl").open()) if q["expected"]]
    by_ws: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for q in questions:
        by_ws[q["workspace"]].append(q)
    out: dict[str, Any] = {"questions": len(questions), "share": args.share}
    for mode in args.modes.split(","):
        keyword_only = mode == "bm25"
        differ = {"daily": 0, "curated": 0, "curated, rated at random (the check's own check)": 0}
        scores: dict[str, list[float]] = defaultdict(list)
        rated_entries: dict[str, int] = defaultdict(int)
        for name, asked in sorted(by_ws.items()):
            daily = quality.build(root / name, args.work / f"imp-{name}-{mode}.sqlite", args.model, keyword_only,
                                  print)
            provider = None if keyword_only else quality.QueryVectors(daily.provider)
            newest = daily.reader().facts.newest_date()  # asked the day after the last session, as bench_quality asks
            now = None if newest is None else (dt.date.fromisoformat(newest) + dt.timedelta(days=1)).isoformat()
            differ["daily"] += sum(a != b for a, b in zip(answers(daily, provider, mode, asked, now),
                                                          answers(daily, provider, mode, asked, now, neutral=True),
                                                          strict=True))
            daily.close()
            for variant in ("unrated", "random", "aligned"):  # one index, MEMORY.md rewritten: vectors are cached
                ws = args.work / "curated" / name
                where = curated(root / name, ws)
                evidence = {where[(e["file"], e["line"])] for q in asked for e in q["expected"]}
                if variant != "unrated":
                    rated_entries[variant] += rate(ws / "MEMORY.md", args.share, seed=zlib.crc32(name.encode()),
                                                   evidence=evidence if variant == "aligned" else None)
                index = quality.build(ws, args.work / f"imp-curated-{name}-{mode}.sqlite", args.model,
                                      keyword_only, print)
                vectors = None if keyword_only else quality.QueryVectors(index.provider)
                found = answers(index, vectors, mode, asked, now)
                if variant != "aligned":
                    differ["curated" if variant == "unrated" else "curated, rated at random (the check's own check)"] \
                        += sum(a != b for a, b in zip(found, answers(index, vectors, mode, asked, now, neutral=True),
                                                      strict=True))
                for q, hits in zip(asked, found, strict=True):
                    expected = {("MEMORY.md", where[(e["file"], e["line"])]) for e in q["expected"]}
                    scores[variant].append(recall(hits, expected))
                index.close()
        row: dict[str, Any] = {"answers_changed_by_the_factor_where_nothing_is_rated": differ,
                               "rated_entries": dict(rated_entries)}
        for variant, values in scores.items():
            row[variant] = {"recall@6": round(statistics.mean(values), 4)}
            if variant != "unrated":
                row[variant]["vs_unrated"] = quality.paired_bootstrap(values, scores["unrated"])
        out[mode] = row
        print(mode, json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
