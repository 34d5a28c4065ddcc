"""Retrieval quality on real data (BEIR SciFact, LoCoMo), per search configuration, with paired bootstrap CIs.

    python bench/bench_quality.py [--sets scifact,locomo,locomo-typos,locomo-partial] [--configs NAME,...]
                                  [--model PATH.gguf] [--work DIR] [--out bench/out/quality.json] [--list]

Needs the evaluation data in ../shared/bench (never copied into this repository). Workspaces and
indexes are written under --work and reused between runs (the index is incremental and the
embedding cache survives), so a second run costs only the queries; each query's vector is computed
once and shared by every configuration.

A configuration is a search as a user asks it: a mode, an answer size `n`, and settings (min_score
included: the defaults unless the configuration says otherwise). `--list` prints them.

SciFact: each document becomes memory/<_id>.md ("# title", blank line, text); a document's score
is its best chunk's; nDCG@10 over the 300 test queries.
LoCoMo: each conversation is its own workspace (locomo_to_workspace.py); a chunk is relevant when
its line range covers an evidence line; per question: recall@6 (evidence lines covered by the
answer's first 6 results), hit@6, MRR over the answer; by category and overall (1,982 questions).
Every configuration is compared with `bm25` question by question: the mean difference and its 95%
interval from 2,000 paired bootstrap resamples, so a one-point change is not mistaken for a gain.
locomo-typo1 / locomo-typo2: the same 1,982 questions with one realistic typo (a neighbouring key or a
dropped letter, past the first letter) in the rarest content word of 4+ letters the conversation holds,
or in the two rarest (two in the one word when only one); paired with `locomo` question by question
when both sets run (`recall@6_vs_clean`).
locomo-typo-first: one typo in the first letter of that rarest word (a neighbouring key, or the letter dropped).
locomo-typos / locomo-partial: the same questions asked as their two longest content words, both
misspelled (two neighbouring letters swapped, anywhere past the first), or as the first half of the
longest one: for the
prefix fallback (compare `hybrid` with `no-prefix`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import statistics
import subprocess
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(ROOT))

from clawmem_index.config import Settings, load_settings, with_overrides  # noqa: E402
from clawmem_index.embeddings.base import ProviderBase  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402
from clawmem_index.text.keywords import query_terms  # noqa: E402


@dataclass(frozen=True)
class Config:
    name: str
    mode: str = "hybrid"
    n: int = 6
    search: dict[str, Any] = field(default_factory=dict)


CONFIGS = [
    Config("bm25", "bm25", search={"min_score": 0.0}),
    Config("bm25-default-min", "bm25"),
    Config("vector", "vector"),
    Config("hybrid"),
    Config("hybrid-n20", n=20),
    Config("hybrid-min0", search={"min_score": 0.0}),
    Config("hybrid-min0.3", search={"min_score": 0.3}),
    Config("hybrid-vw0.5", search={"vector_weight": 0.5, "text_weight": 0.5}),
    Config("hybrid-vw0.4", search={"vector_weight": 0.4, "text_weight": 0.6}),
    Config("rrf", search={"fusion": "rrf", "min_score": 0.0}),
    Config("mmr0.7", search={"mmr_lambda": 0.7}),
    Config("mmr0.7-n20", n=20, search={"mmr_lambda": 0.7}),
    Config("decay90", search={"decay_half_life_days": 90}),
    Config("decay90-n20", n=20, search={"decay_half_life_days": 90}),
    Config("decay90-floor0.5", search={"decay_half_life_days": 90, "decay_floor": 0.5}),
    Config("early2", search={"early_return_ratio": 2.0}),
    Config("early3", search={"early_return_ratio": 3.0}),
    Config("no-prefix", search={"prefix_fallback": False}),
    Config("bm25-no-typos", "bm25", search={"min_score": 0.0, "correct_typos": False}),
    Config("hybrid-no-typos", search={"correct_typos": False}),
    Config("bm25-no-dates", "bm25", search={"min_score": 0.0, "date_weight": 0.0}),
    Config("hybrid-no-dates", search={"date_weight": 0.0}),
    Config("hybrid-dates0.2", search={"date_weight": 0.2}),
    Config("hybrid-dates0.4", search={"date_weight": 0.4}),
    Config("hybrid-dates-hl4", search={"date_half_life_days": 4.0}),
    Config("hybrid-dates-hl4-w14", search={"date_half_life_days": 4.0, "date_window_days": 14}),
    Config("hybrid-dates-hl1", search={"date_half_life_days": 1.0}),
]
BY_NAME = {c.name: c for c in CONFIGS}
BASELINE = "bm25"
PAIRED_WITH: list[str] = []  # --pair: configurations every other one is compared with too, question by question


class QueryVectors(ProviderBase):
    """The provider, remembering each query's vector: every configuration asks the same questions."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.info = provider.info
        self.seen: dict[str, Any] = {}
        self.spent = 0.0  # seconds embedding (a search embeds the query as read: its typos' readings in place)

    def embed_query(self, text: str) -> Any:
        if text not in self.seen:
            started = time.perf_counter()
            self.seen[text] = self.provider.embed_query(text)
            self.spent += time.perf_counter() - started
        return self.seen[text]

    def embed_documents(self, texts: Sequence[str]) -> Any:
        return self.provider.embed_documents(texts)


class SharedIndex:
    """`--postgres`: each index a database of the bundled PostgreSQL the tests use, not a SQLite file."""

    server: Any = None

    @classmethod
    def start(cls) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        import pg_server

        cls.server = pg_server.start(shared_buffers="128MB")  # PostgreSQL's default

    @classmethod
    def overrides_for(cls, index: Path) -> dict[str, Any]:
        import psycopg

        name = "q_" + "".join(c if c.isalnum() else "_" for c in index.stem.lower())
        with psycopg.connect(cls.server.url(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                conn.execute(f"CREATE DATABASE {name}")
        return {"index_backend": "postgres", "index_url": cls.server.url(name)}


def open_index(workspace: Path, index: Path, model: str | None, keyword_only: bool) -> MemoryIndex:
    overrides: dict[str, Any] = {"index": str(index), "embedding.provider": "none" if keyword_only else "local"}
    if SharedIndex.server is not None:
        overrides.update(SharedIndex.overrides_for(index))
    if model and not keyword_only:
        overrides["embedding.local_model"] = model
    settings: Settings = load_settings(workspace=workspace, overrides=overrides, environ={})
    return MemoryIndex(settings, pending_files=lambda: 0)  # queries timed without the freshness scan


def build(workspace: Path, index: Path, model: str | None, keyword_only: bool,
          log: Callable[[str], None]) -> MemoryIndex:
    memory = open_index(workspace, index, model, keyword_only)
    started = time.perf_counter()
    report = memory.sync()
    if report.changed or report.embedded:
        log(f"  indexed {workspace.name} ({'keyword' if keyword_only else 'local'}): {report.added} files, "
            f"{report.embedded} embedded in {time.perf_counter() - started:.1f}s")
    if report.embed_error:
        raise SystemExit(f"embedding failed: {report.embed_error}")
    return memory


class Searcher:
    """Both indexes of one workspace (keyword-only and hybrid), searched as each configuration says."""

    def __init__(self, workspace: Path, work: Path, stem: str, model: str | None, log: Callable[[str], None]) -> None:
        self.keyword = build(workspace, work / f"{stem}-bm25.sqlite", model, True, log)
        self.hybrid = build(workspace, work / f"{stem}-local.sqlite", model, False, log)
        self.vectors = QueryVectors(self.hybrid.provider)
        self.latencies: dict[str, list[float]] = defaultdict(list)
        # the answers' modes (bm25: an early return), and "typo-read": questions with a word read as a typo
        self.modes: dict[str, Counter[str]] = defaultdict(Counter)
        # Questions are asked the day after the conversation's last session ("yesterday" means its last day).
        newest = self.keyword.reader().facts.newest_date()
        self.now = (dt.date.fromisoformat(newest) + dt.timedelta(days=1)).isoformat() if newest else None

    def search(self, config: Config, query: str, n: int | None = None) -> list[dict[str, Any]]:
        memory = self.keyword if config.mode == "bm25" else self.hybrid
        settings = with_overrides(memory.settings, search=config.search).search
        self.vectors.embed_query(query)  # outside the timing: query embedding is excluded
        started, embedding = time.perf_counter(), self.vectors.spent
        outcome = run_search(memory.reader(), None if config.mode == "bm25" else self.vectors,
                             SearchRequest(query, max_results=n or config.n, mode=config.mode, now=self.now), settings)
        self.latencies[config.name].append(time.perf_counter() - started - (self.vectors.spent - embedding))
        self.modes[config.name][outcome.mode] += 1
        if "corrected" in outcome.extra.get("query", {}):  # type: ignore[operator]
            self.modes[config.name]["typo-read"] += 1  # questions with a word read as a typo
        return [r.as_dict() for r in outcome.results]

    def close(self) -> None:
        self.keyword.close()
        self.hybrid.close()


# -- statistics ---------------------------------------------------------------------------------

def paired_bootstrap(ours: Sequence[float], theirs: Sequence[float], rounds: int = 2000,
                     seed: int = 7) -> dict[str, float]:
    """Mean of ours - theirs over the same questions, with the 2.5 and 97.5 percentiles of resampled means."""
    diff = np.asarray(ours, dtype=float) - np.asarray(theirs, dtype=float)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(rounds, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"diff": round(float(diff.mean()), 4), "ci95": [round(float(low), 4), round(float(high), 4)]}


# -- SciFact ------------------------------------------------------------------------------------

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


def run_scifact(work: Path, configs: list[Config], model: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """nDCG@10 of each configuration, asked for 10 results (its own min_score applies)."""
    searcher = Searcher(scifact_workspace(work), work, "scifact", model, log)
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
    per_config: dict[str, list[float]] = {}
    for config in configs:
        scores = []
        for qid, relevant in qrels.items():
            ranked: list[str] = []
            for r in searcher.search(config, queries[qid], n=max(10, config.n)):
                doc = Path(r["path"]).stem
                if doc not in ranked:
                    ranked.append(doc)
            scores.append(ndcg_at_10(ranked, relevant))
        per_config[config.name] = scores
    results = {}
    for config in configs:
        scores = per_config[config.name]
        row: dict[str, Any] = {"ndcg@10": round(statistics.mean(scores), 4), "queries": len(scores),
                               "query_ms_p50": round(1000 * statistics.median(searcher.latencies[config.name]), 2),
                               "answer_modes": dict(searcher.modes[config.name])}
        if BASELINE in per_config and config.name != BASELINE:
            row["vs_bm25"] = paired_bootstrap(scores, per_config[BASELINE])
        results[config.name] = row
        log(f"  scifact {config.name}: {row}")
    searcher.close()
    return results


# -- LoCoMo -------------------------------------------------------------------------------------

def locomo_workspaces(work: Path) -> Path:
    out = work / "locomo"
    if not (out / "qrels.jsonl").exists():
        subprocess.run([sys.executable, str(SHARED / "bench" / "locomo" / "locomo_to_workspace.py"),
                        str(SHARED / "bench" / "locomo" / "locomo10.json"), str(out)], check=True,
                       capture_output=True)
    return out


def locomo_scores(hits: list[dict[str, Any]], expected: set[tuple[str, int]]) -> dict[str, float]:
    def covers(r: dict[str, Any], f: str, line: int) -> bool:
        return bool(r["path"] == f and r["start_line"] <= line <= r["end_line"])

    covered = {(f, line) for (f, line) in expected for r in hits[:6] if covers(r, f, line)}
    first = next((i for i, r in enumerate(hits, start=1) if any(covers(r, f, line) for f, line in expected)), None)
    return {"recall@6": len(covered) / len(expected), "hit@6": 1.0 if covered else 0.0,
            "mrr": 1.0 / first if first else 0.0}


def word_counts(workspace: Path) -> Counter[str]:
    """How often each lower-case word occurs in a workspace's Markdown."""
    counts: Counter[str] = Counter()
    for path in workspace.rglob("*.md"):
        counts.update(m.group().lower() for m in re.finditer(r"\w+", path.read_text(encoding="utf-8")))
    return counts


def misspell(word: str) -> str:
    """A typo past the first letter: two neighbouring letters swapped (the last dropped when they are alike),
    at a position fixed by the word (so every run asks the same), spread over the word as real typos are."""
    i = 1 + sum(map(ord, word)) % (len(word) - 2)
    return word[:i] + word[i + 1] + word[i] + word[i + 2:] if word[i] != word[i + 1] else word[:-1]


def typo_query(question: str) -> str | None:
    """The question's two longest content words, both misspelled (None: fewer than two of 5+ letters)."""
    words = sorted((w for w in query_terms(question) if w.isalpha() and len(w) >= 5), key=len, reverse=True)[:2]
    return " ".join(misspell(w) for w in words) if len(words) == 2 else None


def partial_query(question: str) -> str | None:
    """The start of the question's longest content word (about half of it), as typed by someone unsure."""
    words = sorted((w for w in query_terms(question) if w.isalpha() and len(w) >= 7), key=len, reverse=True)
    return words[0][: len(words[0]) // 2 + 1] if words else None


_KEYS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _neighbours(key: str) -> str:
    """The keys next to `key` on a QWERTY keyboard (same row and the rows above and below)."""
    for r, row in enumerate(_KEYS):
        if key in row:
            i = row.index(key)
            near = [row[j] for j in (i - 1, i + 1) if 0 <= j < len(row)]
            near += [_KEYS[o][j] for o in (r - 1, r + 1) if 0 <= o < len(_KEYS) for j in (i - 1, i, i + 1)
                     if 0 <= j < len(_KEYS[o])]
            return "".join(near)
    return ""


def realistic_typo(word: str, salt: int = 0) -> str:
    """One typo a person makes, past the first letter, fixed by the word (so every run asks the same): a
    neighbouring key instead of a letter, or a letter dropped."""
    h = zlib.crc32(f"{word}/{salt}".encode())
    i = 1 + h % (len(word) - 1)
    near = _neighbours(word[i])
    if (h >> 8) % 2 and near:
        return word[:i] + near[(h >> 12) % len(near)] + word[i + 1:]
    return word[:i] + word[i + 1:]


def first_letter_typo(word: str) -> str:
    """A typo in the first letter, fixed by the word: a neighbouring key instead of it, or it dropped."""
    h = zlib.crc32(f"{word}/first".encode())
    near = _neighbours(word[0])
    return (near[(h >> 12) % len(near)] + word[1:]) if (h >> 8) % 2 and near else word[1:]


def rarest_words(question: str, counts: Counter[str], k: int) -> list[str]:
    """The question's `k` rarest content words of 4+ letters that the conversation holds (rarest first)."""
    words = [w for w in query_terms(question) if w.isalpha() and len(w) >= 4 and counts[w] > 0]
    return sorted(words, key=lambda w: (counts[w], -len(w), w))[:k]


def with_typos(question: str, counts: Counter[str], typos: int) -> str:
    """The question with one realistic typo in each of its `typos` rarest content words (as it is if it has none;
    two typos in its one such word when it has one and two are asked)."""
    words = rarest_words(question, counts, typos)
    if not words:
        return question
    wrong = {w: realistic_typo(w) for w in words}
    if len(words) < typos and len(words[0]) > 4:
        wrong[words[0]] = realistic_typo(wrong[words[0]], salt=1)
    return re.sub(r"\w+", lambda m: wrong.get(m.group().lower(), m.group()), question)


def typo1_query(question: str, counts: Counter[str]) -> str:
    return with_typos(question, counts, 1)


def typo2_query(question: str, counts: Counter[str]) -> str:
    return with_typos(question, counts, 2)


def typo_first_query(question: str, counts: Counter[str]) -> str:
    """The question with a typo in the first letter of its rarest content word (as it is if it has none)."""
    words = rarest_words(question, counts, 1)
    if not words:
        return question
    return re.sub(r"\w+", lambda m: first_letter_typo(words[0]) if m.group().lower() == words[0] else m.group(),
                  question)


TRANSFORMS: dict[str, Callable[..., str | None]] = {"locomo-typos": typo_query, "locomo-partial": partial_query,
                                                    "locomo-typo1": typo1_query, "locomo-typo2": typo2_query,
                                                    "locomo-typo-first": typo_first_query}
# transforms that read the conversation's word counts
WITH_COUNTS = {"locomo-typo1", "locomo-typo2", "locomo-typo-first"}


def run_locomo(work: Path, configs: list[Config], model: str | None, log: Callable[[str], None],
               transform: Callable[..., str | None] | None = None, counted: bool = False) -> dict[str, Any]:
    """`transform`: ask each question as it returns instead (dropped when it returns None); `counted`: it is
    given the conversation's word counts too."""
    root = locomo_workspaces(work)
    questions = [json.loads(line) for line in (root / "qrels.jsonl").open()]
    questions = [q for q in questions if q["expected"]]
    if transform is not None:
        counts = {name: word_counts(root / name) for name in {q["workspace"] for q in questions}} if counted else {}
        questions = [{**q, "question": asked} for q in questions
                     if (asked := transform(q["question"], counts[q["workspace"]]) if counted
                         else transform(q["question"]))]
    by_ws: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(questions):
        by_ws[q["workspace"]].append(i)
    # per configuration, per metric: one value per question (in `questions` order)
    values: dict[str, dict[str, list[float]]] = {c.name: defaultdict(lambda: [0.0] * len(questions)) for c in configs}
    sizes: dict[str, list[int]] = defaultdict(list)
    latencies: dict[str, list[float]] = defaultdict(list)
    modes: dict[str, Counter[str]] = defaultdict(Counter)
    for name, indices in sorted(by_ws.items()):
        searcher = Searcher(root / name, work, f"locomo-{name}", model, log)
        for config in configs:
            for i in indices:
                q = questions[i]
                hits = searcher.search(config, q["question"])
                sizes[config.name].append(len(hits))
                for metric, value in locomo_scores(hits, {(e["file"], e["line"]) for e in q["expected"]}).items():
                    values[config.name][metric][i] = value
            latencies[config.name].extend(searcher.latencies.pop(config.name, []))
            modes[config.name].update(searcher.modes.pop(config.name, Counter()))
        searcher.close()
    categories = sorted({q["category_name"] for q in questions})
    results: dict[str, Any] = {}
    for config in configs:
        row: dict[str, Any] = {"n": config.n, "mode": config.mode, "search": config.search,
                               "mean_results": round(statistics.mean(sizes[config.name]), 2),
                               "query_ms_p50": round(1000 * statistics.median(latencies[config.name]), 2),
                               "answer_modes": dict(modes[config.name])}
        for cat in ("overall", *categories):
            picked = [i for i, q in enumerate(questions) if cat == "overall" or q["category_name"] == cat]
            cell: dict[str, Any] = {m: round(statistics.mean(v[i] for i in picked), 4)
                                    for m, v in values[config.name].items()}
            cell["questions"] = len(picked)
            for against in (BASELINE, *PAIRED_WITH):
                if against in values and config.name != against:
                    base = values[against]["recall@6"]
                    cell[f"recall@6_vs_{against}"] = paired_bootstrap(
                        [values[config.name]["recall@6"][i] for i in picked], [base[i] for i in picked])
            row[cat] = cell
        row["_recall"] = values[config.name]["recall@6"]  # per question, for pairing with another set
        results[config.name] = row
        log(f"  locomo {config.name}: overall {row['overall']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="scifact,locomo")
    parser.add_argument("--configs", default=",".join(c.name for c in CONFIGS))
    parser.add_argument("--model", default=None,
                        help="GGUF embedding model (default: clawmem's default local model, MiniLM converted to f16)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/clawmem-quality"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "quality.json")
    parser.add_argument("--list", action="store_true", help="print the configurations and exit")
    parser.add_argument("--pair", default="", help="compare every configuration with these too (comma-separated)")
    parser.add_argument("--postgres", action="store_true",
                        help="index into a local PostgreSQL (the shared index backend) instead of SQLite files")
    args = parser.parse_args()
    if args.list:
        for c in CONFIGS:
            print(f"{c.name}: mode {c.mode}, n {c.n}, {c.search or 'defaults'}")
        return
    configs = [BY_NAME[name] for name in args.configs.split(",")]
    PAIRED_WITH.extend(name for name in args.pair.split(",") if name)
    if BASELINE not in {c.name for c in configs}:
        configs.insert(0, BY_NAME[BASELINE])
    if not (SHARED / "bench").is_dir():
        raise SystemExit("the evaluation data (../shared/bench) is not beside this project")
    args.work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"model": args.model}
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if args.postgres:
        SharedIndex.start()
        out["index_backend"] = "postgres"
    try:
        run_sets(args, configs, out, log)
    finally:
        if SharedIndex.server is not None:
            SharedIndex.server.close()


def run_sets(args: argparse.Namespace, configs: list[Config], out: dict[str, Any], log: Callable[[str], None]) -> None:
    for name in args.sets.split(","):
        print(f"{name}:", flush=True)
        if name == "scifact":
            out[name] = run_scifact(args.work, configs, args.model, log)
        else:
            out[name] = run_locomo(args.work, configs, args.model, log, TRANSFORMS.get(name), name in WITH_COUNTS)
            if name in WITH_COUNTS and "locomo" in out:  # the same questions with typos, against them as asked
                for config in configs:
                    mine, clean = out[name][config.name], out["locomo"][config.name]
                    mine["recall@6_vs_clean"] = paired_bootstrap(mine.pop("_recall"), clean["_recall"])
                    log(f"  {name} {config.name} vs clean: {mine['recall@6_vs_clean']}")
    for result in out.values():
        for row in result.values() if isinstance(result, dict) else ():
            if isinstance(row, dict):
                row.pop("_recall", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
