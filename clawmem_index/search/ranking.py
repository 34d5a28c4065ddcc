"""Ranking: keyword and vector candidates, fused, filtered, cut into snippets.

Each stage is a pure function over plain data; only `run_search` touches the store and the
embedding provider, so the scoring can be tested (and fuzzed) without either.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from clawmem_index.config import SearchSettings
from clawmem_index.embeddings.base import EmbeddingProvider, pack, unit
from clawmem_index.errors import ClawmemError, QueryError
from clawmem_index.index.interface import FactPart, IndexStore, KeywordPart, VectorPart
from clawmem_index.index.store import ChunkFilter, TextHit, VectorHit
from clawmem_index.search.boosts import Boosts, most_boost
from clawmem_index.search.candidates import Candidate, Sides, gather, read_fixed
from clawmem_index.search.date_prior import DatePrior
from clawmem_index.search.query_plan import QueryPlan, plan_query
from clawmem_index.search.typo_reading import CONTEXT_CHUNKS
from clawmem_index.text.annotations import Annotations, strip_annotations
from clawmem_index.text.dates import DateMention
from clawmem_index.text.keywords import build_prefix_match, match_of
from clawmem_index.text.stemming import tokens

__all__ = ["MAX_QUERY_CHARS", "NO_VECTORS", "Candidate", "SearchOutcome", "SearchRequest", "SearchResult",
           "decay_factor", "fuse_rrf", "iso_date", "mmr", "run_search"]

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
    workspaces: tuple[str, ...] | None = None  # a shared index: search these workspaces (the role must may read them)
    now: str | None = None  # ISO date (or time) relative dates in the query count from (None: today)
    projects: tuple[str, ...] = ()  # the repositories being worked in: entries scoped to them rank higher (boosts)


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
    workspace: str | None = None  # a shared index's answer names each result's workspace
    annotations: Annotations | None = None  # OpenClaw's annotations of the entries it holds

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
        if self.workspace is not None:
            data["workspace"] = self.workspace
        notes = self.annotations
        if notes is not None:
            data.update((key, value) for key, value in (("importance", notes.importance), ("triggers", notes.triggers),
                                                        ("projects", notes.projects)) if value is not None)
        return data


@dataclass
class SearchOutcome:
    results: list[SearchResult]
    mode: str
    degraded: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


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


def decay_factor(date: str | None, half_life_days: float, reference: dt.date, floor: float) -> float:
    """How much of its score a chunk keeps for its age: `floor + (1 - floor) x 2^(-age / half-life)`.

    Ages count from `reference` (the newest date in the index, so a memory left alone for a year
    does not fade as a whole). An undated chunk (MEMORY.md, notes without a date) is current: 1.
    The floor keeps an old but exactly relevant chunk in reach of newer, vaguer ones.
    """
    if date is None:
        return 1.0
    try:
        age = max(0, (reference - dt.date.fromisoformat(date)).days)
    except ValueError:
        return 1.0
    return float(floor + (1.0 - floor) * 0.5 ** (age / half_life_days))


_WORDS = re.compile(r"\w+", re.UNICODE)
# Characters of a query that are read (its dates, keywords, typos) and embedded; the rest of a longer one is left
# out, so no query costs more than a page of text does, whatever a client sends (up to the socket's 1 MiB line).
MAX_QUERY_CHARS = 8192
NO_VECTORS = "no vectors stored yet (still being made, or none made so far): keyword results only"


def mmr(ranked: list[Candidate], lam: float, pool: int, floor: float) -> list[Candidate]:
    """Maximal marginal relevance over the first `pool` candidates; the rest keep their order after them.

    Relevance is each score relative to the best (so `lam` means the same for every query); only a
    candidate with at least `floor` of the best's relevance can be moved ahead, so diversity never
    promotes a chunk that barely matches. Likeness is the Jaccard overlap of the chunks' word sets,
    which needs no vectors (keyword-only indexes too). Each pick updates every candidate's closest
    likeness once, so the cost is pool x picks set operations. The pool does not depend on how many
    results are asked for, so neither does the order.
    """
    if not ranked:
        return ranked
    top = ranked[0].score or 1.0
    head = [c for c in ranked[:pool] if c.score / top >= floor]
    chosen = {c.seq for c in head}
    words = {c.seq: frozenset(_WORDS.findall(c.text.lower())) for c in head}
    closest = {c.seq: 0.0 for c in head}
    picked: list[Candidate] = []
    left = list(head)
    while left:
        place = max(range(len(left)),
                    key=lambda i: (lam * left[i].score / top - (1.0 - lam) * closest[left[i].seq], -i))
        best = left.pop(place)
        picked.append(best)
        for c in left:
            closest[c.seq] = max(closest[c.seq], _jaccard(words[c.seq], words[best.seq]))
    return picked + [c for c in ranked if c.seq not in chosen]


def _explain(c: Candidate, place: int, how: str, settings: SearchSettings,
             prior: DatePrior | None = None, boosts: Boosts | None = None) -> dict[str, object]:
    """How a result got its place: each side's rank and score, its closeness to the days the query names, the
    fused score, and what decay and MMR did."""
    data: dict[str, object] = {
        "keyword_rank": c.text_rank, "keyword_score": None if c.text_score is None else round(c.text_score, 6),
        "vector_rank": c.vector_rank, "vector_score": None if c.vector_score is None else round(c.vector_score, 6),
        "fusion": how, "fused_score": round(c.fused, 6),
    }
    if prior is not None:
        data["date_closeness"] = round(c.closeness, 6)
    boost = boosts(c) if boosts is not None else 1.0
    if boost != 1.0:
        data["annotation_factor"] = round(boost, 6)  # importance and repository scope (search.boosts)
    if settings.decay_half_life_days:
        data["decay_factor"] = round(c.score / c.fused / boost, 6) if c.fused else 1.0
    if settings.mmr_lambda:
        data["mmr"] = {"place_before": c.before_mmr, "place_after": place}
    return data


def _passing(cands: Iterable[Candidate], min_score: float) -> list[Candidate]:
    """Best first, those whose fused score reaches `min_score`, one per citation."""
    return _one_per_citation(sorted((c for c in cands if c.fused >= min_score),
                                    key=lambda c: (-c.score, c.path, c.start_line)))


def _one_per_citation(ranked: Iterable[Candidate]) -> list[Candidate]:
    """The best candidate of each (path, start_line, end_line): the pieces of one long line share a
    citation, and an answer that cites the same lines twice wastes a place on a repeat."""
    seen: set[tuple[str | None, str, int, int]] = set()
    kept: list[Candidate] = []
    for c in ranked:
        key = c.citation
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
        shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
        raise QueryError(f"{name!r} must be an ISO date like 2026-11-22, not {shown}") from None


def _today(now: str | None) -> dt.date:
    """The day a query's relative dates count from: the request's `now`, else this machine's today."""
    day = iso_date(now, "now")
    if day is None:
        return dt.date.today()
    if not "1900" <= day < "2101":
        raise QueryError(f"'now' must be a date between 1900 and 2100, not {day}")
    return dt.date.fromisoformat(day)


def snippet(text: str, limit: int) -> str:
    """At most `limit` characters, cut on a character (never a byte) boundary."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def run_search(store: IndexStore, provider: EmbeddingProvider | None, request: SearchRequest,  # noqa: C901
               settings: SearchSettings, *, today: dt.date | None = None) -> SearchOutcome:
    """Retrieve (within the request's filter) and fuse -> min_score -> decay -> one per citation -> MMR -> snippets.

    The order does not depend on `max_results` (see clawmem_index.search.candidates): an answer's first k
    results are the first k of any larger answer to the same request. `today` is the date recency
    decay counts ages from (default: the newest date in the index).
    """
    query = request.query.strip() if isinstance(request.query, str) else ""
    if not query:
        raise QueryError("the query is empty: give some words to search for")
    cut = len(query) > MAX_QUERY_CHARS
    if cut:  # read, matched and embedded as its beginning; the answer says so
        query = query[:MAX_QUERY_CHARS]
    mode = asked = request.mode or settings.mode
    if mode not in ("hybrid", "bm25", "vector"):
        raise QueryError(f"unknown search mode {mode!r}: use hybrid, bm25 or vector")
    limit = request.max_results or settings.max_results
    if not 1 <= limit <= 1000:
        raise QueryError("max_results must be between 1 and 1000")
    min_score = settings.min_score if request.min_score is None else request.min_score
    if request.source not in (None, "memory", "sessions"):
        raise QueryError(f"unknown source {request.source!r}: use memory or sessions")
    where = ChunkFilter(request.path_prefix or None, request.source, iso_date(request.since, "since"),
                        iso_date(request.before, "before"))

    degraded: str | None = None
    blob: bytes | None = None
    def prior_of(dates: tuple[DateMention, ...]) -> DatePrior:
        return DatePrior(dates, settings.date_weight, settings.date_half_life_days, settings.date_window_days)

    def has_notes(mention: DateMention) -> bool:
        """Whether the index has a note dated near `mention` (a date with none stays words)."""
        return any(store.facts.dated_chunks(window, first, last, 1) for window, first, last in
                   prior_of((mention,)).windows(where))

    def found_by(words: list[str]) -> list[frozenset[str]]:
        """The stems of each of the chunks `words` find best in scope: the context a typo is read in."""
        match = match_of(words)
        return [] if match is None else [frozenset(tokens(hit.text)) for hit in
                                         store.keywords.hits(store.keywords.ranking(match, CONTEXT_CHUNKS, where))]

    plan = plan_query(query, store.keywords.vocabulary if settings.correct_typos and mode != "vector" else None,
                      _today(request.now) if settings.date_weight else None, has_notes, found_by)
    prior = prior_of(plan.dates) if plan.dates else None
    if mode == "hybrid" and settings.early_return_ratio and _keywords_decide(store, plan, where,
                                                                            settings.early_return_ratio):
        mode = "bm25"
    if mode != "bm25":
        if provider is None:
            degraded = "no embedding provider: keyword results only"
        elif not store.vectors.readable():
            degraded = NO_VECTORS
        else:
            try:
                vec = unit(provider.embed_query(plan.as_meant(query)))
            except ClawmemError as exc:
                vec, degraded = None, f"embedding the query failed ({exc}): keyword results only"
            blob = None if vec is None else pack(vec)
        if blob is None:
            mode = "bm25"
    match = plan.match if mode != "vector" else None
    vector_blob = blob
    # With a vector side, the keyword list is read deep at once: its scores fill in vector candidates.
    keywords = None if match is None else _KeywordSide(store.keywords, match, where, settings.candidate_cap,
                                                       ahead=settings.candidate_cap if vector_blob else 0)
    sides = Sides(
        text=None if keywords is None else keywords.hits,
        vector=None if vector_blob is None else _VectorSide(store.vectors, vector_blob, where).hits,
        text_of=None if keywords is None else keywords.scores_of,
        vector_of=None if vector_blob is None else lambda seqs: store.vectors.distances_of(vector_blob, seqs),
        text_ahead=TEXT_AHEAD if vector_blob is not None and store.vectors.in_cells() else 0,
        dated=None if prior is None else _DatedSide(store.facts, prior, where).hits,
        closeness=None if prior is None else prior.closeness, date_weight=0.0 if prior is None else prior.weight,
    )
    decay = _decay(store, settings, today)
    # Annotations weigh only what carries them: an index without any is ranked exactly as before.
    kinds = store.facts.annotation_kinds()
    boosts = Boosts(store.facts.annotations_of, request.projects) if kinds else None
    factor = decay if boosts is None else (lambda c: decay(c) * boosts(c))
    weighing: dict[str, Any] = {} if boosts is None else {"prepare": boosts.prepare,
                                                          "factor_max": most_boost(kinds, request.projects)}
    want = max(limit, settings.mmr_pool if settings.mmr_lambda else 0)
    if mode == "hybrid" and settings.fusion == "rrf":
        cands = fuse_rrf(read_fixed(sides, settings.candidate_pool), settings.rrf_k)
        if boosts is not None:
            boosts.prepare(cands)
        for c in cands:
            c.fused = (1.0 - sides.date_weight) * c.score + sides.date_weight * c.closeness
            c.score = c.fused * factor(c)
        effective = "hybrid"
    else:
        total = settings.text_weight + settings.vector_weight
        weights = {"bm25": (1.0, 0.0), "vector": (0.0, 1.0),
                   "hybrid": (settings.text_weight / total, settings.vector_weight / total)}[mode]
        pools = gather(sides, weights=weights, want=want, pool=settings.candidate_pool, cap=settings.candidate_cap,
                       factor=factor, min_score=min_score,
                       text_exponent=settings.text_exponent if mode == "hybrid" else 1.0, **weighing)
        effective = mode
        if mode == "hybrid" and not any(c.vector_rank for c in pools.candidates):
            # No vector near enough (none stored yet, or none within the filter): rank as keyword search does.
            pools = gather(replace(sides, vector=None), weights=(1.0, 0.0), want=want, pool=settings.candidate_pool,
                           cap=settings.candidate_cap, factor=factor, min_score=min_score, **weighing)
            effective = "bm25"
        cands = pools.candidates

    ranked = _passing(cands, min_score)
    if not ranked and settings.prefix_fallback and asked != "vector":  # a vector search asked for meaning alone
        prefix = build_prefix_match(plan.words)
        if prefix is not None:
            pools = gather(Sides(text=_KeywordSide(store.keywords, prefix, where, settings.candidate_cap).hits),
                           weights=(1.0, 0.0), want=want, pool=settings.candidate_pool, cap=settings.candidate_cap,
                           factor=factor, min_score=min_score, **weighing)
            ranked = _passing(pools.candidates, min_score)
            effective = "prefix" if ranked else effective
    _with_text(store, ranked, want)
    for place, c in enumerate(ranked, start=1):
        c.before_mmr = place
    if settings.mmr_lambda:
        ranked = mmr(ranked, settings.mmr_lambda, settings.mmr_pool, settings.mmr_floor)
    ranked = ranked[:limit]
    how = settings.fusion if effective == "hybrid" else effective  # "prefix": the fallback on word beginnings
    results = [
        SearchResult(c.path, c.start_line, c.end_line, c.score,
                     snippet(strip_annotations(c.text), settings.snippet_chars), c.source, c.vector_score, c.text_score,
                     _explain(c, place, how, settings, prior, boosts) if request.explain else None, c.workspace,
                     None if boosts is None else boosts.annotations(c.seq))
        for place, c in enumerate(ranked, start=1)
    ]
    read = plan.as_dict()
    if cut:
        read["read_chars"] = MAX_QUERY_CHARS
    return SearchOutcome(results, effective, degraded, {"query": read} if read else {})


class _KeywordSide:
    """The keyword list, read `ahead` deep at once when a vector side needs its scores (FTS5 scores
    every match to sort them whatever the depth, so reading deeper, and a vector candidate's keyword
    score, are then lookups; a chunk past the read is asked for by rowid), else as deep as asked.
    Rows are fetched only for the depth a search reads."""

    def __init__(self, keywords: KeywordPart, match: str, where: ChunkFilter, cap: int, *, ahead: int = 0) -> None:
        self._keywords, self._match, self._where, self._cap, self._ahead = keywords, match, where, cap, ahead
        self._ranking: list[tuple[int, float]] = []
        self._read = 0  # how deep the ranking was asked for
        self._known: dict[int, float] | None = None
        self._hits: list[TextHit] = []

    def ranking(self, depth: int) -> list[tuple[int, float]]:
        if depth > self._read and len(self._ranking) >= self._read:
            self._read = min(self._cap, max(depth, self._ahead))
            self._ranking = self._keywords.ranking(self._match, self._read, self._where)
            self._known = None
        return self._ranking

    def hits(self, depth: int) -> list[TextHit]:
        ranking = self.ranking(depth)
        if len(self._hits) < min(depth, len(ranking)):
            self._hits = self._keywords.hits(ranking[:depth])
        return self._hits[:depth]

    def scores_of(self, seqs: list[int]) -> dict[int, float]:
        ranking = self.ranking(self._ahead or 1)
        if self._known is None:
            self._known = dict(ranking)
        known = self._known
        found = {seq: known[seq] for seq in seqs if seq in known}
        if len(ranking) >= self._read:  # not every match was read: ask for the rest
            found.update(self._keywords.scores_of(self._match, [seq for seq in seqs if seq not in known]))
        return found


# Keyword hits a hybrid search over k-means cells reads at once: there a deeper vector read ranks
# thousands of vectors fetched one by one (~40 ms at 1M chunks), while 256 keyword hits cost ~2 ms and
# lower the bound on unseen chunks enough to spare most such reads (docs/benchmarks.md, stop 28).
TEXT_AHEAD = 256
READ_AHEAD = 4  # a vector read returns this many times the depth asked, so the proof's deeper reads are lookups


class _VectorSide:
    """The vector list, read ahead: the first read ranks READ_AHEAD times the depth asked among the
    sign-bit candidates for that depth (the prefilter, which dominates the cost, runs once), so the
    proof's next reads (twice, four times as deep) need no second search."""

    def __init__(self, vectors: VectorPart, blob: bytes, where: ChunkFilter) -> None:
        self._vectors, self._blob, self._where = vectors, blob, where
        self._hits: list[VectorHit] = []
        self._read = 0  # how deep the last search was asked to go

    def hits(self, depth: int) -> list[VectorHit]:
        if depth > len(self._hits) and len(self._hits) >= self._read:
            self._read = depth * READ_AHEAD
            self._hits = self._vectors.search(self._blob, self._read, self._where, candidates_for=depth)
        return self._hits[:depth]


def _keywords_decide(store: IndexStore, plan: QueryPlan, where: ChunkFilter, ratio: float) -> bool:
    """Whether the best keyword match leads the next by `ratio` (or is the only one): then the query
    is not embedded and the answer is keyword-only (an exact id or a rare name needs no meaning)."""
    match = plan.match
    if match is None:
        return False
    top = store.keywords.search(match, 2, where)
    if not top:
        return False
    return len(top) == 1 or -top[0].bm25 >= ratio * max(0.0, -top[1].bm25)


class _DatedSide:
    """The chunks dated within the days a query names (their windows), nearest first, read ahead as the vector
    side is; with the closeness a chunk not yet read can have at most (0: every window was read whole)."""

    def __init__(self, facts: FactPart, prior: DatePrior, where: ChunkFilter) -> None:
        self._facts, self._prior = facts, prior
        self._windows = prior.windows(where)
        self._read = 0
        self._hits: list[TextHit] = []
        self._bound = 0.0

    def hits(self, depth: int) -> tuple[list[TextHit], float]:
        if depth > self._read:
            self._read = depth * READ_AHEAD
            found: dict[int, TextHit] = {}
            self._bound = 0.0
            for window, first, last in self._windows:
                listed = self._facts.dated_chunks(window, first, last, self._read)
                for hit in listed:
                    found.setdefault(hit.seq, hit)
                if len(listed) >= self._read:
                    self._bound = max(self._bound, self._prior.closeness(listed[-1].date))
            self._hits = sorted(found.values(), key=lambda h: (-self._prior.closeness(h.date), h.seq))
        return self._hits, self._bound  # all read: they carry no text, and the proof then needs no deeper read


def _with_text(store: IndexStore, ranked: list[Candidate], upto: int) -> None:
    """Read the text of the first `upto` candidates listed only for their date (`dated_chunks` leaves it out:
    a window of busy days holds many chunks, and only an answer's few are shown)."""
    missing = [c for c in ranked[:upto] if not c.text]
    if missing:
        texts = {hit.seq: hit.text for hit in store.keywords.hits([(c.seq, 0.0) for c in missing])}
        for c in missing:
            c.text = texts.get(c.seq, "")


def _decay(store: IndexStore, settings: SearchSettings, today: dt.date | None) -> Callable[[Candidate], float]:
    """Each candidate's recency factor (1 for all when decay is off)."""
    if not settings.decay_half_life_days:
        return lambda c: 1.0
    if today is None:
        newest = store.facts.newest_date()
        today = dt.date.fromisoformat(newest) if newest else dt.date.today()
    reference, half_life, floor = today, settings.decay_half_life_days, settings.decay_floor
    return lambda c: decay_factor(c.date, half_life, reference, floor)
