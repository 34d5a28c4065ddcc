"""Candidate pools that do not depend on how many results are asked for.

A hybrid answer fuses two ranked lists. Cutting each list at a depth that grows with the answer's
size (the old `max_results x candidate_multiplier`) made the answer depend on that size: a chunk
just past one side's cut was fused with 0 for that side, and moved up when a larger answer let it
in. Here a candidate found on one side gets the score it really has on the other (BM25 from the
whole table's statistics, cosine from its stored vector), so its fused score is the same at any
depth; and the lists are read deeper (doubling from `pool`, up to `cap`) until the threshold
algorithm (Fagin, Lotem and Naor) shows that no chunk unseen on both sides can beat the answer's
last place. The first k results of any answer are then the first k of every larger one.

The vector list comes from the vector index, which is exact on small indexes and near-exact
(sign-bit prefilter, recall@k >= 99.4%) on large ones: there, "true" means as the index answers.
RRF fuses ranks, which a fill-in cannot give: it reads each list to the fixed depth `pool`, so its
answer is also the same for every size, and holds at most the union of both lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clawmem_index.index.rows import TextHit
from clawmem_index.index.rows import VectorHit

__all__ = ["Candidate", "Pools", "Sides", "gather", "read_fixed"]

Citation = tuple[str | None, str, int, int]  # workspace (None: the only one), path, lines


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
    text_rank: int | None = None  # place among the keyword list as read (1 = best), None: not read that deep
    vector_rank: int | None = None
    fused: float = 0.0  # the score before decay
    closeness: float = 0.0  # to the days the query names (search.date_prior), 0 when it names none
    before_mmr: int = 0  # place before MMR re-ordered the answer
    workspace: str | None = None

    @property
    def citation(self) -> Citation:
        return self.workspace, self.path, self.start_line, self.end_line


@dataclass(frozen=True)
class Sides:
    """How to read each side: its best `depth` hits, and the score of given chunks (fill-in)."""

    text: Callable[[int], Sequence[TextHit]] | None = None
    vector: Callable[[int], Sequence[VectorHit]] | None = None
    text_of: Callable[[list[int]], dict[int, float]] | None = None  # seq -> bm25 (negative: better is lower)
    vector_of: Callable[[list[int]], dict[int, float]] | None = None  # seq -> cosine distance
    text_ahead: int = 0  # the text side's least read depth (reading it deeper costs less than the vector side)
    # The chunks dated near the days the query names (search.date_prior), nearest first, and the closeness one not
    # among them can have at most (0: none is left).
    dated: Callable[[int], tuple[Sequence[TextHit], float]] | None = None
    closeness: Callable[[str | None], float] | None = None  # a chunk's closeness to those days, by its date
    date_weight: float = 0.0  # the share of the fused score closeness takes


@dataclass(frozen=True)
class Pools:
    """What `gather` read: the candidates scored, how deep, and whether the order is proven."""

    candidates: list[Candidate]
    depth: int
    proven: bool


def text_relevance(bm25: float) -> float:
    return max(0.0, -bm25)


def vector_similarity(distance: float) -> float:
    """Cosine distance (0..2) to similarity clipped to 0..1."""
    return min(1.0, max(0.0, 1.0 - distance))


def gather(sides: Sides, *, weights: tuple[float, float], want: int, pool: int, cap: int,
           factor: Callable[[Candidate], float], min_score: float, text_exponent: float = 1.0,
           prepare: Callable[[list[Candidate]], None] | None = None, factor_max: float = 1.0) -> Pools:
    """Candidates with both sides' scores and `score = ((1-wd)*(wt*text**text_exponent + wv*vector) + wd*closeness)
    * factor`, deep enough for `want` (`text`: BM25 relative to the best hit's, 0..1; `wd`, `closeness`: the
    days the query names, `sides.date_weight`, 0 when it names none; the dated chunks are candidates too).

    `weights` = (text, vector), summing to 1; `factor` (decay, annotations' boosts) is at most `factor_max`,
    and `prepare` is given each round's candidates before it is asked (a batch look-up). An exponent below 1 lifts
    the keyword side's middling matches (any power keeps its order, so the bounds below hold). The
    text side is read at least `sides.text_ahead` deep: its lower bound then lets the vector side stop
    sooner. An unseen chunk's closeness is at most the dated list's bound (0 when it was read whole).
    Stops once `want` distinct citations score above what an unseen chunk could (or
    `min_score` bars every unseen chunk, or both lists are exhausted), or at depth `cap` (then
    `proven` is False).
    """
    wt, wv = weights
    wd = sides.date_weight
    depth = min(cap, max(1, pool, 2 * want))
    while True:
        text_depth = min(cap, max(depth, sides.text_ahead))
        text_hits = list(sides.text(text_depth)) if sides.text is not None and wt > 0 else []
        vector_hits = list(sides.vector(depth)) if sides.vector is not None and wv > 0 else []
        dated_hits, dated_bound = sides.dated(depth) if sides.dated is not None else ((), 0.0)
        cands = _merge(text_hits, vector_hits, dated_hits, sides.closeness)
        best = text_relevance(text_hits[0].bm25) if text_hits else 0.0
        text_done = sides.text is None or wt == 0 or len(text_hits) < text_depth
        vector_done = sides.vector is None or wv == 0 or len(vector_hits) < depth
        _fill(cands, sides, text_done=text_done, vector_done=vector_done, wt=wt, wv=wv)
        if prepare is not None:
            prepare(cands)
        for c in cands:
            c.fused = (1.0 - wd) * (wt * _norm(c.text_score, best) ** text_exponent + wv * (c.vector_score or 0.0)) \
                + wd * c.closeness
            c.score = c.fused * factor(c)
        bound = (1.0 - wd) * (
            (0.0 if text_done else wt * _norm(text_relevance(text_hits[-1].bm25), best) ** text_exponent)
            + (0.0 if vector_done else wv * vector_similarity(vector_hits[-1].distance))) + wd * dated_bound
        proven = (text_done and vector_done and not dated_bound) or bound < min_score or \
            len({c.citation for c in cands if c.fused >= min_score and c.score > bound * factor_max}) >= want
        if proven or depth >= cap:
            for c in cands:
                c.text_score = None if c.text_score is None else _norm(c.text_score, best)
            return Pools(cands, depth, proven)
        depth = min(cap, depth * 2)


def read_fixed(sides: Sides, depth: int) -> list[Candidate]:
    """Both lists read to `depth` with each side's rank (for RRF), text scores relative to the best."""
    text_hits = list(sides.text(depth)) if sides.text is not None else []
    vector_hits = list(sides.vector(depth)) if sides.vector is not None else []
    dated_hits = sides.dated(depth)[0] if sides.dated is not None else ()
    cands = _merge(text_hits, vector_hits, dated_hits, sides.closeness)
    best = text_relevance(text_hits[0].bm25) if text_hits else 0.0
    for c in cands:
        if c.text_score is not None:
            c.text_score = _norm(c.text_score, best)
    return cands


def _norm(relevance: float | None, best: float) -> float:
    """A keyword relevance relative to the best hit's (1.0 when no hit has a positive relevance)."""
    if relevance is None:
        return 0.0
    if best <= 0.0:
        return 1.0
    return relevance / best


def _merge(text_hits: Sequence[TextHit], vector_hits: Sequence[VectorHit], dated_hits: Sequence[TextHit],
           closeness: Callable[[str | None], float] | None) -> list[Candidate]:
    """One candidate per chunk (the dated list's too); `text_score` holds the raw relevance (-bm25) until
    normalised; each has its closeness to the days the query names."""
    by_seq: dict[int, Candidate] = {}
    for rank, hit in enumerate(text_hits, start=1):
        by_seq[hit.seq] = Candidate(hit.seq, hit.path, hit.source, hit.start_line, hit.end_line, hit.text,
                                    text_score=text_relevance(hit.bm25), date=hit.date, text_rank=rank,
                                    workspace=hit.workspace)
    for rank, vhit in enumerate(vector_hits, start=1):
        cand = by_seq.get(vhit.seq)
        if cand is None:
            cand = by_seq[vhit.seq] = Candidate(vhit.seq, vhit.path, vhit.source, vhit.start_line, vhit.end_line,
                                                vhit.text, date=vhit.date, workspace=vhit.workspace)
        cand.vector_score = vector_similarity(vhit.distance)
        cand.vector_rank = rank
    for dhit in dated_hits:  # not keyword hits: their keyword score is filled in like a vector candidate's
        if dhit.seq not in by_seq:
            by_seq[dhit.seq] = Candidate(dhit.seq, dhit.path, dhit.source, dhit.start_line, dhit.end_line, dhit.text,
                                         date=dhit.date, workspace=dhit.workspace)
    if closeness is not None:
        for cand in by_seq.values():
            cand.closeness = closeness(cand.date)
    return list(by_seq.values())


def _fill(cands: list[Candidate], sides: Sides, *, text_done: bool, vector_done: bool, wt: float, wv: float) -> None:
    """Give each candidate the score it has on the side that did not list it (none if it has none there)."""
    if wt > 0 and not text_done and sides.text_of is not None:
        missing = [c.seq for c in cands if c.text_score is None]
        if missing:
            scores = sides.text_of(missing)
            for c in cands:
                if c.seq in scores:
                    c.text_score = text_relevance(scores[c.seq])
    if wv > 0 and not vector_done and sides.vector_of is not None:
        missing = [c.seq for c in cands if c.vector_score is None]
        if missing:
            distances = sides.vector_of(missing)
            for c in cands:
                if c.seq in distances:
                    c.vector_score = vector_similarity(distances[c.seq])
