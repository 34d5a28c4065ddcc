"""Other ways to fuse the keyword and vector scores, tried offline on LoCoMo against the default.

    python bench/bench_fusion.py --work /tmp/q --model ../shared/models/all-MiniLM-L6-v2-q8_0.gguf

Uses bench_quality.py's workspaces and indexes (built there first, or here). Each question's
candidates are read once, deep (the best 200 of each side, each candidate with both scores, as the
search fills them in); then every formula ranks the same candidates, keeps one result per citation,
drops those under its `min_score` and scores the first 6 as bench_quality.py does. `default`
reproduces the engine's answer (0.4 x (BM25 relative to the best hit) ** 0.5 + 0.6 x cosine,
`min_score` 0.2; "keyword side ^ 1.0" is the formula before stop 34),
so a formula's difference from it is the formula's alone. Differences are from BM25, in points of
recall@6, overall and per category.

`--windows` (a local model): each candidate chunk's windows are embedded apart, and its cosine is
taken as the best window's, or half that and half the stored vector's (the token-weighted mean of
the windows), under the default formula: what keeping one vector per window (several times the
vectors) would give.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bench_quality as bq

from clawmem_index.embeddings.base import pack, unit
from clawmem_index.text.keywords import build_match

DEPTH = 200


@dataclass(frozen=True)
class Cand:
    seq: int
    relevance: float | None  # -bm25 (None: no query word)
    cosine: float  # clipped to 0..1, as the engine does
    path: str
    start_line: int
    end_line: int


Formula = Callable[[Cand, float], float]  # (candidate, best keyword relevance) -> fused score


def relative(c: Cand, best: float) -> float:
    if c.relevance is None:
        return 0.0
    return 1.0 if best <= 0 else c.relevance / best


def read_candidates(work: Path, model: str | None) -> list[tuple[dict, list[Cand]]]:
    root = bq.locomo_workspaces(work)
    questions = [q for q in map(json.loads, (root / "qrels.jsonl").open()) if q["expected"]]
    by_ws: dict[str, list[dict]] = defaultdict(list)
    for q in questions:
        by_ws[q["workspace"]].append(q)
    out = []
    for name, asked in sorted(by_ws.items()):
        searcher = bq.Searcher(root / name, work, f"locomo-{name}", model, print)
        store = searcher.hybrid.reader()
        for q in asked:
            match = build_match(q["question"])
            ranked = dict(store.keywords.ranking(match, DEPTH)) if match else {}
            blob = pack(unit(searcher.vectors.embed_query(q["question"])))
            distances = {h.seq: h.distance for h in store.vectors.search(blob, DEPTH)}
            seqs = set(ranked) | set(distances)
            if match:
                ranked.update(store.keywords.scores_of(match, [s for s in seqs if s not in ranked]))
            distances.update(store.vectors.distances_of(blob, [s for s in seqs if s not in distances]))
            rows = store.conn.execute("SELECT seq, path, start_line, end_line FROM chunks WHERE seq IN"
                                      " (SELECT value FROM json_each(?))", (json.dumps(sorted(seqs)),))
            cands = [Cand(seq, None if seq not in ranked else -ranked[seq],
                          min(1.0, max(0.0, 1.0 - distances.get(seq, 1.0))), path, a, b) for seq, path, a, b in rows]
            out.append((q, cands))
        searcher.close()
    return out


def window_cosines(work: Path, model: str | None,
                   data: list[tuple[dict, list[Cand]]]) -> tuple[dict[tuple[str, int], list[float]], list[list[float]]]:
    """Per (workspace, chunk) its windows' unit vectors, and per question its query's unit vector."""
    root = bq.locomo_workspaces(work)
    windows: dict[tuple[str, int], list[list[float]]] = {}
    by_ws: dict[str, list[int]] = defaultdict(list)
    for i, (q, _) in enumerate(data):
        by_ws[q["workspace"]].append(i)
    queries = [[] for _ in data]
    for name, picked in sorted(by_ws.items()):
        searcher = bq.Searcher(root / name, work, f"locomo-{name}", model, print)
        provider = searcher.hybrid.provider
        store = searcher.hybrid.reader()
        for seq, text in store.conn.execute("SELECT seq, text FROM chunks"):
            pieces = provider._pieces(text, 0)
            windows[(name, seq)] = [unit_list(v) for v in provider.embed_documents([p.text for p in pieces])]
        for i in picked:
            queries[i] = unit_list(searcher.vectors.embed_query(data[i][0]["question"]))
        searcher.close()
    return windows, queries


def unit_list(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def with_window_cosines(data: list[tuple[dict, list[Cand]]], windows: dict[tuple[str, int], list[list[float]]],
                        queries: list[list[float]], share: float) -> list[tuple[dict, list[Cand]]]:
    """The candidates with cosine = share x best window's + (1 - share) x the stored vector's."""
    out = []
    for (q, cands), query in zip(data, queries, strict=True):
        def best(c: Cand) -> float:
            return max(sum(a * b for a, b in zip(query, w, strict=True)) for w in windows[(q["workspace"], c.seq)])
        out.append((q, [dataclasses.replace(c, cosine=min(1.0, max(0.0, share * best(c) + (1 - share) * c.cosine)))
                        for c in cands]))
    return out


def recall(data: list[tuple[dict, list[Cand]]], formula: Formula, min_score: float) -> list[float]:
    values = []
    for q, cands in data:
        best = max((c.relevance for c in cands if c.relevance is not None), default=0.0)
        scored = sorted(((formula(c, best), c.seq, c) for c in cands), key=lambda t: (-t[0], t[1]))
        hits: list[Cand] = []
        cited: set[tuple[str, int, int]] = set()
        for score, _, c in scored:
            if score < min_score or len(hits) == 6:
                break
            if (c.path, c.start_line, c.end_line) not in cited:
                cited.add((c.path, c.start_line, c.end_line))
                hits.append(c)
        expected = {(e["file"], e["line"]) for e in q["expected"]}
        covered = {(f, line) for f, line in expected for c in hits
                   if c.path == f and c.start_line <= line <= c.end_line}
        values.append(len(covered) / len(expected))
    return values


def formulas() -> dict[str, tuple[Formula, float]]:
    def blend(wt: float, text: Callable[[float], float] = lambda x: x,
              vector: Callable[[float], float] = lambda x: x) -> Formula:
        return lambda c, best: wt * text(relative(c, best)) + (1 - wt) * vector(c.cosine)

    def adaptive(scale: float, k: float) -> Formula:  # the keyword side weighs more when its best hit is strong
        return lambda c, best: blend(scale * best / (best + k))(c, best)

    found: dict[str, tuple[Formula, float]] = {
        "bm25": (lambda c, best: relative(c, best) if c.relevance is not None else -1.0, 0.0),
        "default": (blend(0.4, text=lambda x: x ** 0.5), 0.2),
        "default, min_score 0": (blend(0.4, text=lambda x: x ** 0.5), 0.0),
    }
    for p in (0.4, 0.6, 0.7, 1.0, 1.5, 2.0):
        found[f"keyword side ^ {p}"] = (blend(0.4, text=lambda x, p=p: x ** p), 0.2)
    for p in (0.5, 1.5, 2.0, 3.0):
        found[f"cosine ^ {p}, min_score 0"] = (blend(0.4, vector=lambda x, p=p: x ** p), 0.0)
    for k in (1.0, 2.0, 4.0):
        found[f"keyword side s/(s+{k:g}), min_score 0"] = (
            lambda c, best, k=k: 0.4 * ((c.relevance or 0.0) / ((c.relevance or 0.0) + k)) + 0.6 * c.cosine, 0.0)
    for scale in (0.6, 0.8):
        for k in (2.0, 5.0, 10.0):
            found[f"keyword weight {scale:g} x best/(best+{k:g}), min_score 0"] = (adaptive(scale, k), 0.0)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--model")
    parser.add_argument("--windows", action="store_true", help="compare one vector per window (a local model)")
    args = parser.parse_args()
    data = read_candidates(args.work, args.model)
    if args.windows:
        compare_windows(args.work, args.model, data)
        return
    categories = sorted({q["category_name"] for q, _ in data})
    base = recall(data, *formulas()["bm25"])
    print(f"{len(data)} questions; BM25 recall@6 {statistics.mean(base):.4f}")
    print("| formula | recall@6 | vs BM25 | " + " | ".join(categories) + " |")
    print("|---|---|---|" + "---|" * len(categories))
    for name, (formula, min_score) in formulas().items():
        if name == "bm25":
            continue
        got = recall(data, formula, min_score)
        per_cat = []
        for cat in categories:
            picked = [i for i, (q, _) in enumerate(data) if q["category_name"] == cat]
            per_cat.append(f"{100 * statistics.mean(got[i] - base[i] for i in picked):+.1f}")
        print(f"| {name} | {statistics.mean(got):.4f} |"
              f" {100 * statistics.mean(g - b for g, b in zip(got, base, strict=True)):+.2f} | "
              + " | ".join(per_cat) + " |")


def compare_windows(work: Path, model: str | None, data: list[tuple[dict, list[Cand]]]) -> None:
    windows, queries = window_cosines(work, model, data)
    base = recall(data, *formulas()["bm25"])
    default, min_score = formulas()["default"]
    print(f"{len(data)} questions; BM25 recall@6 {statistics.mean(base):.4f}")
    print("| chunk cosine | hybrid recall@6 | vs BM25 | vector only |")
    print("|---|---|---|---|")
    for name, share in (("stored vector (mean of windows)", 0.0), ("best window", 1.0), ("half each", 0.5)):
        scored = with_window_cosines(data, windows, queries, share)
        got = recall(scored, default, min_score)
        vector = recall(scored, lambda c, best: c.cosine, 0.0)
        print(f"| {name} | {statistics.mean(got):.4f} |"
              f" {100 * statistics.mean(g - b for g, b in zip(got, base, strict=True)):+.2f}"
              f" | {statistics.mean(vector):.4f} |")


if __name__ == "__main__":
    main()
