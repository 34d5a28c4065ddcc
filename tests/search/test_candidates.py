"""Candidate pools: fused scores that do not depend on depth, read until the order is proven.

The sides here are plain lists (what the keyword and vector indexes answer), so the property can be
checked against a brute-force ranking of every chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawmem_index.index.rows import TextHit
from clawmem_index.index.rows import VectorHit
from clawmem_index.search.candidates import Candidate, Sides, gather, read_fixed


@dataclass(frozen=True)
class Chunk:
    seq: int
    bm25: float | None  # None: the query's words are not in it
    distance: float | None  # None: no vector yet
    date: str | None = None


class Corpus:
    """Both indexes over the same chunks, counting how deep each was read."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.reads: list[tuple[str, int]] = []

    def sides(self, text_ahead: int = 0) -> Sides:
        by_text = sorted((c for c in self.chunks if c.bm25 is not None), key=lambda c: (c.bm25, c.seq))
        by_vector = sorted((c for c in self.chunks if c.distance is not None), key=lambda c: (c.distance, c.seq))

        def text(depth: int) -> list[TextHit]:
            self.reads.append(("text", depth))
            return [TextHit(c.seq, f"p{c.seq}", "memory", 1, 1, "", c.bm25, c.date) for c in by_text[:depth]]

        def vector(depth: int) -> list[VectorHit]:
            self.reads.append(("vector", depth))
            return [VectorHit(c.seq, f"p{c.seq}", "memory", 1, 1, "", c.distance, c.date) for c in by_vector[:depth]]

        lookup = {c.seq: c for c in self.chunks}
        return Sides(text=text, vector=vector,
                     text_of=lambda seqs: {s: lookup[s].bm25 for s in seqs if lookup[s].bm25 is not None},
                     vector_of=lambda seqs: {s: lookup[s].distance for s in seqs if lookup[s].distance is not None},
                     text_ahead=text_ahead)

    def exact(self, weights: tuple[float, float], factor: Callable[[Chunk], float],
              exponent: float = 1.0) -> dict[int, float]:
        """Every chunk's fused score, computed from all of them."""
        best = max((-c.bm25 for c in self.chunks if c.bm25 is not None), default=0.0)
        out = {}
        for c in self.chunks:
            text = 0.0 if c.bm25 is None else (1.0 if best <= 0 else max(0.0, -c.bm25) / best)
            vector = 0.0 if c.distance is None else min(1.0, max(0.0, 1.0 - c.distance))
            out[c.seq] = (weights[0] * text ** exponent + weights[1] * vector) * factor(c)
        return out


def ordered(cands: list[Candidate], min_score: float) -> list[int]:
    return [c.seq for c in sorted((c for c in cands if c.fused >= min_score), key=lambda c: (-c.score, c.path))]


chunks_strategy = st.lists(
    st.tuples(st.one_of(st.none(), st.floats(-20.0, 0.0)), st.one_of(st.none(), st.floats(0.0, 2.0)),
              st.sampled_from([None, 0.5, 0.8, 1.0])),
    min_size=1, max_size=60,
).map(lambda rows: [Chunk(i, b, d, None if f is None else str(f)) for i, (b, d, f) in enumerate(rows)])


@settings(max_examples=300, deadline=None)
@given(chunks=chunks_strategy, text_weight=st.sampled_from([0.0, 0.25, 0.4, 1.0]), pool=st.integers(1, 8),
       min_score=st.sampled_from([0.0, 0.1, 0.3, 0.6]), small=st.integers(1, 12), extra=st.integers(1, 40),
       decayed=st.booleans(), text_ahead=st.sampled_from([0, 3, 30]), exponent=st.sampled_from([1.0, 0.5, 2.0]))
def test_the_first_k_are_the_same_for_every_larger_answer_and_are_the_true_first_k(
        chunks: list[Chunk], text_weight: float, pool: int, min_score: float, small: int, extra: int,
        decayed: bool, text_ahead: int, exponent: float) -> None:
    weights = (text_weight, 1.0 - text_weight)
    corpus = Corpus(chunks)

    def factor(c: Candidate | Chunk) -> float:
        return float(c.date) if decayed and c.date is not None else 1.0

    def answer(want: int) -> list[int]:
        pools = gather(corpus.sides(text_ahead), weights=weights, want=want, pool=pool, cap=4096, factor=factor,
                       min_score=min_score, text_exponent=exponent)
        assert pools.proven
        return ordered(pools.candidates, min_score)[:want]

    first, larger = answer(small), answer(small + extra)
    assert larger[:small] == first
    exact = corpus.exact(weights, factor, exponent)
    fused = corpus.exact(weights, lambda c: 1.0, exponent)
    listed = {c.seq for c in chunks if (weights[0] and c.bm25 is not None) or (weights[1] and c.distance is not None)}
    truth = [seq for seq in sorted(exact, key=lambda s: (-exact[s], f"p{s}"))
             if fused[seq] >= min_score and seq in listed]
    scores = [exact[s] for s in first]
    assert scores == pytest.approx([exact[s] for s in truth[:small]])  # the true best (ties may swap)


def test_a_chunk_found_on_one_side_gets_its_real_score_on_the_other() -> None:
    # Read one deep: chunk 2 tops the keyword list and is third by vectors; chunk 0 tops the vectors.
    corpus = Corpus([Chunk(0, None, 0.0), Chunk(1, -1.0, 0.01), Chunk(2, -10.0, 0.05)])
    pools = gather(corpus.sides(), weights=(0.5, 0.5), want=1, pool=1, cap=1, factor=lambda c: 1.0, min_score=0.0)
    scored = {c.seq: c for c in pools.candidates}
    assert set(scored) == {0, 2}
    assert scored[2].vector_score == pytest.approx(0.95) and scored[2].vector_rank is None
    assert scored[0].text_score is None  # it has no keyword match: nothing to fill in
    assert ordered(pools.candidates, 0.0) == [2, 0]


def test_an_exponent_below_one_lifts_the_keyword_sides_middling_matches() -> None:
    """0.4 x (relative BM25) ** 0.5 + 0.6 x cosine: a chunk holding a quarter of the best keyword
    score and a far vector passes one with a closer vector and no keyword at all."""
    corpus = Corpus([Chunk(0, -8.0, 1.0), Chunk(1, -2.0, 0.9), Chunk(2, None, 0.72)])
    plain = gather(corpus.sides(), weights=(0.4, 0.6), want=3, pool=4, cap=64, factor=lambda c: 1.0, min_score=0.0)
    lifted = gather(corpus.sides(), weights=(0.4, 0.6), want=3, pool=4, cap=64, factor=lambda c: 1.0, min_score=0.0,
                    text_exponent=0.5)
    assert {c.seq: round(c.fused, 6) for c in plain.candidates} == {0: 0.4, 1: 0.16, 2: 0.168}
    assert {c.seq: round(c.fused, 6) for c in lifted.candidates} == {0: 0.4, 1: 0.26, 2: 0.168}
    assert ordered(plain.candidates, 0.0) == [0, 2, 1] and ordered(lifted.candidates, 0.0) == [0, 1, 2]
    assert {c.seq: c.text_score for c in lifted.candidates} == {0: 1.0, 1: 0.25, 2: None}  # reported as read


def test_the_bound_on_unread_chunks_is_raised_to_the_exponent_too() -> None:
    """Read 2 deep, the best so far is A (0.4 x 1 + 0.6 x 0.1 = 0.46). An unread chunk could reach
    0.4 x 0.25 ** 0.5 + 0.6 x 0.5 = 0.5, and C does (0.490): without the exponent the bound would be
    0.4 x 0.25 + 0.6 x 0.5 = 0.4 and the reading would stop, answering A."""
    corpus = Corpus([Chunk(0, -10.0, 0.9), Chunk(1, -2.5, None), Chunk(2, -2.4, 0.51), Chunk(3, None, 0.45),
                     Chunk(4, None, 0.5)])
    pools = gather(corpus.sides(), weights=(0.4, 0.6), want=1, pool=1, cap=64, factor=lambda c: 1.0,
                   min_score=0.0, text_exponent=0.5)
    assert pools.proven and ordered(pools.candidates, 0.0)[0] == 2
    assert max(depth for _, depth in corpus.reads) > 2


def test_reading_stops_as_soon_as_no_unseen_chunk_can_pass_min_score() -> None:
    corpus = Corpus([Chunk(i, -10.0 + i, 0.1 * i) for i in range(50)])
    gather(corpus.sides(), weights=(0.4, 0.6), want=2, pool=4, cap=4096, factor=lambda c: 1.0, min_score=0.9)
    assert max(depth for _, depth in corpus.reads) == 4  # 0.4 x 0.7 + 0.6 x 0.7 < 0.9 at the first depth


def test_the_first_read_is_twice_the_answer_when_that_is_deeper_than_the_pool() -> None:
    corpus = Corpus([Chunk(i, -100.0 + i, 0.01 * i) for i in range(100)])
    gather(corpus.sides(), weights=(0.4, 0.6), want=20, pool=4, cap=4096, factor=lambda c: 1.0, min_score=0.0)
    assert corpus.reads[0][1] == 40


def test_reading_the_text_side_ahead_lets_the_vector_side_stop_sooner() -> None:
    """The best keyword chunks are the worst by vectors: at a shallow depth both bounds stay high."""
    chunks = [Chunk(i, -(100.0 - i), 0.3 + 0.001 * (99 - i)) for i in range(100)]
    for ahead, vector_depth in ((0, 16), (32, 4)):
        corpus = Corpus(chunks)
        pools = gather(corpus.sides(ahead), weights=(0.5, 0.5), want=2, pool=4, cap=4096, factor=lambda c: 1.0,
                       min_score=0.0)
        assert pools.proven and ordered(pools.candidates, 0.0)[:2] == [0, 1]
        assert max(depth for side, depth in corpus.reads if side == "vector") == vector_depth
        assert min(depth for side, depth in corpus.reads if side == "text") == max(4, ahead)


def test_the_cap_bounds_the_text_side_read_ahead_too() -> None:
    corpus = Corpus([Chunk(i, -(100.0 - i), 0.3 + 0.001 * (99 - i)) for i in range(100)])
    pools = gather(corpus.sides(32), weights=(0.5, 0.5), want=2, pool=4, cap=8, factor=lambda c: 1.0, min_score=0.0)
    assert max(depth for _, depth in corpus.reads) == 8 and not pools.proven


def test_the_cap_bounds_the_reading_and_says_the_order_is_not_proven() -> None:
    corpus = Corpus([Chunk(i, -100.0 + i, 0.01 * i) for i in range(100)])
    pools = gather(corpus.sides(), weights=(0.4, 0.6), want=60, pool=4, cap=16, factor=lambda c: 1.0, min_score=0.0)
    assert max(depth for _, depth in corpus.reads) == 16 and not pools.proven


def test_read_fixed_keeps_each_sides_rank_and_fills_nothing_in() -> None:
    corpus = Corpus([Chunk(0, -3.0, 1.5), Chunk(1, -1.0, 0.1), Chunk(2, None, 0.2)])
    cands = {c.seq: c for c in read_fixed(corpus.sides(), 1)}
    assert set(cands) == {0, 1}
    assert (cands[0].text_rank, cands[0].vector_rank, cands[0].vector_score) == (1, None, None)
    assert (cands[1].text_rank, cands[1].vector_rank, cands[1].text_score) == (None, 1, None)
