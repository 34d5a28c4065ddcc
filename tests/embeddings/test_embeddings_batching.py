from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawmem_index.embeddings.base import normalize
from clawmem_index.embeddings.batching import Piece, Plan, combine, embed_planned, plan_batches, split_text
from clawmem_index.errors import ProviderError
from clawmem_index.text.tokens import get_encoding

ENC = get_encoding("cl100k_base")


def tokens(text: str) -> int:
    return len(ENC.encode_ordinary(text))


def test_short_text_is_one_piece() -> None:
    assert split_text("hello world", 10, ENC) == [("hello world", 2)]


def test_long_text_is_cut_into_pieces_within_the_limit_that_join_back() -> None:
    text = " ".join(f"word{i}" for i in range(300))
    pieces = split_text(text, 50, ENC)
    assert len(pieces) >= tokens(text) // 50
    assert "".join(p for p, _ in pieces) == text
    for piece, count in pieces:
        assert count == tokens(piece) <= 50


@pytest.mark.parametrize("text", ["日本語のテキスト" * 40, "🙂🎉👩‍👩‍👧" * 40, "é" * 500 + "ß" * 300])
def test_multibyte_text_is_cut_on_character_boundaries(text: str) -> None:
    pieces = split_text(text, 7, ENC)
    assert len(pieces) > 1
    assert "".join(p for p, _ in pieces) == text
    assert all("\ufffd" not in p for p, _ in pieces)
    assert all(tokens(p) <= 7 for p, _ in pieces)


def test_limit_below_one_character_is_refused() -> None:
    with pytest.raises(ValueError):
        split_text("text", 3, ENC)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=400), limit=st.integers(min_value=4, max_value=40))
def test_split_property(text: str, limit: int) -> None:
    pieces = split_text(text, limit, ENC)
    assert "".join(p for p, _ in pieces) == text
    for piece, count in pieces:
        assert count == tokens(piece) <= limit


def test_batches_by_count() -> None:
    plan = plan_batches([f"t{i}" for i in range(7)], batch_size=3, batch_tokens=1000, max_input_tokens=100,
                        encoding=ENC)
    assert [len(b) for b in plan.batches] == [3, 3, 1]
    assert [plan.pieces[i].text for b in plan.batches for i in b] == [f"t{i}" for i in range(7)]


def test_batches_by_token_budget() -> None:
    text = " ".join(["alpha"] * 30)  # 30 tokens
    assert tokens(text) == 30
    plan = plan_batches([text] * 5, batch_size=100, batch_tokens=64, max_input_tokens=1000, encoding=ENC)
    assert [len(b) for b in plan.batches] == [2, 2, 1]
    for batch in plan.batches:
        assert sum(plan.pieces[i].tokens for i in batch) <= 64


def exact_plan(texts: list[str], batch_size: int, batch_tokens: int, max_input_tokens: int) -> list[list[str]]:
    """The batches when every text is counted first: what the bounds must never change."""
    pieces = [(part or " ", max(count, 1)) for text in texts
              for part, count in split_text(text, min(max_input_tokens, batch_tokens), ENC)]
    batches: list[list[str]] = []
    used = 0
    for text, count in pieces:
        if batches and batches[-1] and (len(batches[-1]) >= batch_size or used + count > batch_tokens):
            batches.append([])
            used = 0
        if not batches:
            batches.append([])
        batches[-1].append(text)
        used += count
    return batches


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(max_size=120) | st.sampled_from(["word " * 40, "日本語" * 30, "", "🙂" * 25]),
                      max_size=30),
       batch_size=st.integers(min_value=1, max_value=12), batch_tokens=st.integers(min_value=8, max_value=300),
       max_input_tokens=st.integers(min_value=4, max_value=200))
def test_texts_counted_by_their_bytes_are_batched_as_when_counted_exactly(
        texts: list[str], batch_size: int, batch_tokens: int, max_input_tokens: int) -> None:
    plan = plan_batches(texts, batch_size=batch_size, batch_tokens=batch_tokens, max_input_tokens=max_input_tokens,
                        encoding=ENC)
    assert [[plan.pieces[i].text for i in batch] for batch in plan.batches] == exact_plan(
        texts, batch_size, batch_tokens, max_input_tokens)
    for batch in plan.batches:  # counts or bounds: each request within the budget
        assert sum(tokens(plan.pieces[i].text) for i in batch) <= batch_tokens or len(batch) == 1


def test_texts_that_fit_by_their_bytes_are_not_tokenized_when_the_budget_is_far() -> None:
    class Counting:
        def __init__(self) -> None:
            self.calls = 0

        def encode_ordinary(self, text: str) -> list[int]:
            self.calls += 1
            return ENC.encode_ordinary(text)

    encoding = Counting()
    texts = [f"note {i} about the greenhouse " * 20 for i in range(64)]
    plan = plan_batches(texts, batch_size=64, batch_tokens=300_000, max_input_tokens=8191, encoding=encoding)
    assert encoding.calls == 0 and [p.text for p in plan.pieces] == texts
    tight = plan_batches(texts, batch_size=64, batch_tokens=2_000, max_input_tokens=8191, encoding=encoding)
    assert encoding.calls > 0 and len(tight.batches) > 1  # near the budget, counted


def test_over_limit_text_is_split_and_tagged_with_its_source() -> None:
    long = " ".join(["beta"] * 100)
    plan = plan_batches(["short", long, "tail"], batch_size=10, batch_tokens=1000, max_input_tokens=30,
                        encoding=ENC)
    sources = [p.source for p in plan.pieces]
    assert sources[0] == 0 and sources[-1] == 2
    assert sources.count(1) >= 4
    assert all(p.tokens <= 30 for p in plan.pieces)
    assert "".join(p.text for p in plan.pieces if p.source == 1) == long


def test_pieces_are_capped_by_the_batch_budget_too() -> None:
    plan = plan_batches([" ".join(["gamma"] * 200)], batch_size=10, batch_tokens=64, max_input_tokens=8000,
                        encoding=ENC)
    assert all(sum(plan.pieces[i].tokens for i in b) <= 64 for b in plan.batches)
    assert len(plan.pieces) >= 200 // 64


def test_empty_text_is_sent_as_a_space() -> None:
    plan = plan_batches(["", "x"], batch_size=10, batch_tokens=100, max_input_tokens=100, encoding=ENC)
    assert [p.text for p in plan.pieces] == [" ", "x"]
    assert plan.pieces[0].tokens == 1


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(max_size=200), max_size=12), size=st.integers(1, 5),
       budget=st.integers(8, 80), limit=st.integers(4, 60))
def test_plan_property(texts: list[str], size: int, budget: int, limit: int) -> None:
    plan = plan_batches(texts, batch_size=size, batch_tokens=budget, max_input_tokens=limit, encoding=ENC)
    flat = [i for batch in plan.batches for i in batch]
    assert flat == list(range(len(plan.pieces)))
    assert [p.source for p in plan.pieces] == sorted(p.source for p in plan.pieces)
    assert {p.source for p in plan.pieces} == set(range(len(texts)))
    for batch in plan.batches:
        assert 1 <= len(batch) <= size
        assert sum(plan.pieces[i].tokens for i in batch) <= budget
    assert all(p.tokens <= min(limit, budget) for p in plan.pieces)


def _plan(*pieces: Piece, texts: int) -> Plan:
    return Plan(pieces=tuple(pieces), batches=(tuple(range(len(pieces))),), texts=texts)


def test_combine_weights_pieces_by_tokens_and_renormalises() -> None:
    plan = _plan(Piece("a", 3, 0), Piece("b", 1, 0), Piece("c", 5, 1), texts=2)
    out = combine(plan, [[2.0, 0.0], [0.0, 5.0], [3.0, 4.0]])
    assert out[0] == pytest.approx(normalize([3.0, 1.0]))
    assert out[1] == pytest.approx([0.6, 0.8])
    assert all(math.isclose(sum(x * x for x in v), 1.0) for v in out)


@pytest.mark.parametrize("bad", [[0.0, 0.0], [float("nan"), 1.0], [float("inf"), 0.0]])
def test_combine_refuses_zero_and_non_finite_vectors(bad: list[float]) -> None:
    with pytest.raises(ProviderError):
        combine(_plan(Piece("a", 1, 0), texts=1), [bad])


def test_combine_refuses_pieces_that_cancel_out() -> None:
    with pytest.raises(ProviderError, match="cancel"):
        combine(_plan(Piece("a", 1, 0), Piece("b", 1, 0), texts=1), [[1.0, 0.0], [-1.0, 0.0]])


def test_combine_refuses_a_wrong_number_of_vectors() -> None:
    with pytest.raises(ProviderError):
        combine(_plan(Piece("a", 1, 0), texts=1), [[1.0], [1.0]])


def test_embed_planned_sends_each_batch_once_in_order() -> None:
    plan = plan_batches(["a", "b", "c"], batch_size=2, batch_tokens=100, max_input_tokens=100, encoding=ENC)
    calls: list[list[str]] = []

    def request(inputs: list[str]) -> list[list[float]]:
        calls.append(inputs)
        return [[float(ord(t[0])), 1.0] for t in inputs]

    out = embed_planned(plan, request)
    assert calls == [["a", "b"], ["c"]]
    assert out[2] == pytest.approx(normalize([99.0, 1.0]))


def test_embed_planned_refuses_a_short_answer() -> None:
    plan = plan_batches(["a", "b"], batch_size=2, batch_tokens=100, max_input_tokens=100, encoding=ENC)
    with pytest.raises(ProviderError, match="1 vectors for 2 inputs"):
        embed_planned(plan, lambda inputs: [[1.0]])
