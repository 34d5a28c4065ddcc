"""Ranking: keyword and vector candidates, fused, filtered, cut into snippets.

Each stage is a pure function over plain data; only `run_search` touches the store and the
embedding provider, so the scoring can be tested (and fuzzed) without either.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from clawmem_index.config import SearchSettings
from clawmem_index.embeddings.base import EmbeddingProvider, pack, unit
from clawmem_index.errors import ClawmemError, QueryError
from clawmem_index.keywords import build_match
from clawmem_index.store import ChunkFilter, Store, TextHit, VectorHit

__all__ = ["Candidate", "SearchOutcome", "SearchRequest", "SearchResult", "decay", "fuse_rrf", "fuse_weighted",
           "iso_date", "mmr", "run_search"]

Mode = Literal["hybrid", "bm25", "vector"]


@dataclass(frozen=True)
class SearchRequest:
    """`since`/`before` are ISO dates (inclusive/exclusive) on the chunks' own dates; `source` is memory or sessions."""

    query: str
    max_results: int | None = None
    min_score: float | None = None
    mode: str | None = None
    path_prefix: str | None = None
    source: str | None = None
    since: str | None = None
    before: str | None = None
    explain: bool = False  # each result says how it got its place (keyword and vector side, fusion, decay, MMR)


@dataclass(frozen=True)
class SearchResult:
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    source: str
    vector_score: float | None = None
    text_score: float | None = None
    explain: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "path": self.path, "start_line": self.start_line, "end_line": self.end_line,
            "score": round(self.score, 6), "snippet": self.snippet, "source": self.source,
        }
        if self.vector_score is not None:
            data["vector_score"] = round(self.vector_score, 6)
        if self.text_score is not None:
            data["text_score"] = round(self.text_score, 6)
        if self.explain is not None:
            data["explain"] = self.explain
        return data


@dataclass
class Candidate:
    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    text_score: float | None = None
    vector_score: float | None = None
    score: float = 0.0
    date: str | None = None
    text_rank: int | None = None  # place among the keyword candidates (1 = best), None: not among them
    vector_rank: int | None = None
    fused: float = 0.0  # the score before decay
    before_mmr: int = 0  # place before MMR re-ordered the answer


@dataclass
class SearchOutcome:
    results: list[SearchResult]
    mode: str
    degraded: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def text_scores(hits: Sequence[TextHit]) -> list[float]:
    """BM25 mapped monotonically to 0..1: FTS5 ranks are negative, so -rank is the relevance; divide by the best."""
    relevance = [max(0.0, -h.bm25) for h in hits]
    best = max(relevance, default=0.0)
    if best <= 0.0:
        return [1.0 for _ in hits]
    return [r / best for r in relevance]


def vector_scores(hits: Sequence[VectorHit]) -> list[float]:
    """Cosine distance (0..2) to similarity clipped to 0..1."""
    return [min(1.0, max(0.0, 1.0 - h.distance)) for h in hits]


def merge(text_hits: Sequence[TextHit], vector_hits: Sequence[VectorHit]) -> list[Candidate]:
    by_seq: dict[int, Candidate] = {}
    for rank, (hit, score) in enumerate(zip(text_hits, text_scores(text_hits), strict=True), start=1):
        by_seq[hit.seq] = Candidate(hit.seq, hit.path, hit.source, hit.start_line, hit.end_line, hit.text,
                                    text_score=score, date=hit.date, text_rank=rank)
    for rank, (hit, score) in enumerate(zip(vector_hits, vector_scores(vector_hits), strict=True), start=1):
        cand = by_seq.get(hit.seq)
        if cand is None:
            cand = by_seq[hit.seq] = Candidate(hit.seq, hit.path, hit.source, hit.start_line, hit.end_line, hit.text,
                                               date=hit.date)
        cand.vector_score = score
        cand.vector_rank = rank
    return list(by_seq.values())


def fuse_weighted(cands: list[Candidate], vector_weight: float, text_weight: float) -> list[Candidate]:
    total = vector_weight + text_weight
    vw, tw = vector_weight / total, text_weight / total
    for c in cands:
        c.score = vw * (c.vector_score or 0.0) + tw * (c.text_score or 0.0)
    return sorted(cands, key=lambda c: (-c.score, c.path, c.start_line))


def fuse_rrf(cands: list[Candidate], k: int) -> list[Candidate]:
    """Reciprocal rank fusion, scaled so a first place on both sides scores 1.0 (comparable to min_score)."""
    def ranks(key: str) -> dict[int, int]:
        ordered = sorted((c for c in cands if getattr(c, key) is not None), key=lambda c: -getattr(c, key))
        return {c.seq: i for i, c in enumerate(ordered, start=1)}

    text_rank, vector_rank = ranks("text_score"), ranks("vector_score")
    best = 2.0 / (k + 1)
    for c in cands:
        raw = sum(1.0 / (k + r[c.seq]) for r in (text_rank, vector_rank) if c.seq in r)
        c.score = raw / best
    return sorted(cands, key=lambda c: (-c.score, c.path, c.start_line))


def decay(cands: list[Candidate], half_life_days: float, today: dt.date) -> list[Candidate]:
    """Older dated chunks count less: score x 2^(-age / half-life). Undated ones (MEMORY.md) never decay."""
    for c in cands:
        if c.date is not None:
            age = max(0, (today - dt.date.fromisoformat(c.date)).days)
            c.score *= 0.5 ** (age / half_life_days)
    return sorted(cands, key=lambda c: (-c.score, c.path, c.start_line))


_WORDS = re.compile(r"\w+", re.UNICODE)


def mmr(cands: list[Candidate], lam: float, limit: int) -> list[Candidate]:
    """Maximal marginal relevance: each next pick trades its score against its likeness to the picks so far.

    Likeness is the Jaccard overlap of the chunks' word sets, which needs no vectors (keyword-only
    indexes too) and is what makes two chunks near-duplicates in an answer.
    """
    words = {c.seq: frozenset(_WORDS.findall(c.text.lower())) for c in cands}
    picked: list[Candidate] = []
    left = list(cands)
    while left and len(picked) < limit:
        def worth(c: Candidate) -> float:
            overlap = max((_jaccard(words[c.seq], words[p.seq]) for p in picked), default=0.0)
            return lam * c.score - (1.0 - lam) * overlap

        best = max(left, key=worth)
        picked.append(best)
        left.remove(best)
    return picked


def _explain(c: Candidate, place: int, how: str, settings: SearchSettings) -> dict[str, object]:
    """How a result got its place: each side's rank and score, the fused score, and what decay and MMR did."""
    data: dict[str, object] = {
        "keyword_rank": c.text_rank, "keyword_score": None if c.text_score is None else round(c.text_score, 6),
        "vector_rank": c.vector_rank, "vector_score": None if c.vector_score is None else round(c.vector_score, 6),
        "fusion": how, "fused_score": round(c.fused, 6),
    }
    if settings.decay_half_life_days:
        data["decay_factor"] = round(c.score / c.fused, 6) if c.fused else 1.0
    if settings.mmr_lambda:
        data["mmr"] = {"place_before": c.before_mmr, "place_after": place}
    return data


def _one_per_citation(ranked: Iterable[Candidate]) -> list[Candidate]:
    """The best candidate of each (path, start_line, end_line): the pieces of one long line share a
    citation, and an answer that cites the same lines twice wastes a place on a repeat."""
    seen: set[tuple[str, int, int]] = set()
    kept: list[Candidate] = []
    for c in ranked:
        key = (c.path, c.start_line, c.end_line)
        if key not in seen:
            seen.add(key)
            kept.append(c)
    return kept


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def iso_date(value: str | None, name: str) -> str | None:
    """A date bound as YYYY-MM-DD (a full ISO timestamp is cut to its date), or a QueryError saying why not."""
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value[:10]).isoformat()
    except ValueError:
        raise QueryError(f"{name!r} must be an ISO date like 2026-11-22, not {value!r}") from None


def snippet(text: str, limit: int) -> str:
    """At most `limit` characters, cut on a character (never a byte) boundary."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def run_search(store: Store, provider: EmbeddingProvider | None, request: SearchRequest,
               settings: SearchSettings, *, today: dt.date | None = None) -> SearchOutcome:
    """Retrieve (within the request's filter) -> fuse -> filter by min_score -> decay -> diversify -> snippets.

    `today` is the date recency decay counts ages from (the current date by default).
    """
    query = request.query.strip() if isinstance(request.query, str) else ""
    if not query:
        raise QueryError("the query is empty: give some words to search for")
    mode = request.mode or settings.mode
    if mode not in ("hybrid", "bm25", "vector"):
        raise QueryError(f"unknown search mode {mode!r}: use hybrid, bm25 or vector")
    limit = request.max_results or settings.max_results
    if not 1 <= limit <= 1000:
        raise QueryError("max_results must be between 1 and 1000")
    min_score = settings.min_score if request.min_score is None else request.min_score
    n_candidates = limit * settings.candidate_multiplier
    if request.source not in (None, "memory", "sessions"):
        raise QueryError(f"unknown source {request.source!r}: use memory or sessions")
    where = ChunkFilter(request.path_prefix or None, request.source, iso_date(request.since, "since"),
                        iso_date(request.before, "before"))

    degraded: str | None = None
    vector_hits: list[VectorHit] = []
    if mode != "bm25":
        if provider is None or not store.vec_table_exists():
            degraded = "no embeddings available: keyword results only"
        else:
            try:
                vec = unit(provider.embed_query(query))
            except ClawmemError as exc:
                vec, degraded = None, f"embedding the query failed ({exc}): keyword results only"
            if vec is not None:
                vector_hits = store.vector_search(pack(vec), n_candidates, where)
        if degraded and mode == "vector":
            mode = "bm25"
    text_hits: list[TextHit] = []
    if mode != "vector":
        match = build_match(query)
        if match is not None:
            text_hits = store.text_search(match, n_candidates, where)

    cands = merge(text_hits, vector_hits)
    if mode == "bm25" or (mode == "hybrid" and not vector_hits):
        ranked = sorted(cands, key=lambda c: (-(c.text_score or 0.0), c.path, c.start_line))
        for c in ranked:
            c.score = c.text_score or 0.0
        effective = "bm25"
    elif mode == "vector":
        ranked = sorted(cands, key=lambda c: (-(c.vector_score or 0.0), c.path, c.start_line))
        for c in ranked:
            c.score = c.vector_score or 0.0
        effective = "vector"
    elif settings.fusion == "rrf":
        ranked, effective = fuse_rrf(cands, settings.rrf_k), "hybrid"
    else:
        ranked, effective = fuse_weighted(cands, settings.vector_weight, settings.text_weight), "hybrid"

    ranked = _one_per_citation(c for c in ranked if c.score >= min_score)
    for c in ranked:
        c.fused = c.score
    if settings.decay_half_life_days:
        ranked = decay(ranked, settings.decay_half_life_days, today or dt.date.today())
    for place, c in enumerate(ranked, start=1):
        c.before_mmr = place
    ranked = mmr(ranked, settings.mmr_lambda, limit) if settings.mmr_lambda else ranked[:limit]
    how = settings.fusion if effective == "hybrid" else effective
    results = [
        SearchResult(c.path, c.start_line, c.end_line, c.score, snippet(c.text, settings.snippet_chars), c.source,
                     c.vector_score, c.text_score,
                     _explain(c, place, how, settings) if request.explain else None)
        for place, c in enumerate(ranked, start=1)
    ]
    return SearchOutcome(results, effective, degraded)
