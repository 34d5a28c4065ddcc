"""Request planning for remote embedders: batches by count and token budget, over-limit texts split.

A provider rejects (or silently truncates) an input over its per-input token limit and a request
over its per-request limits. We never send either: a long text is cut into pieces on token
boundaries that are also character boundaries, each piece is embedded on its own, and the text's
vector is the token-weighted mean of its pieces' unit vectors, normalised again. The planning
functions are pure; `embed_planned` runs a plan through a callable that makes one request.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from clawmem_index.embeddings.base import unit
from clawmem_index.errors import ProviderError
from clawmem_index.text.tokens import split_by_tokens

if TYPE_CHECKING:
    import tiktoken

__all__ = ["Piece", "Plan", "combine", "embed_planned", "in_flight", "plan_batches", "split_text"]

T = TypeVar("T")


@dataclass(frozen=True)
class Piece:
    """One input as sent: a whole text, or a slice of one (`source` is the text's index).

    `tokens` is exact for a slice; for a whole text it may be its UTF-8 bytes, a bound (plan_batches).
    """

    text: str
    tokens: int
    source: int


@dataclass(frozen=True)
class Plan:
    pieces: tuple[Piece, ...]
    batches: tuple[tuple[int, ...], ...]
    texts: int


def split_text(text: str, max_tokens: int, encoding: tiktoken.Encoding) -> list[tuple[str, int]]:
    """Cut `text` into (piece, token count) pairs of at most `max_tokens` tokens each (see `split_by_tokens`)."""
    return list(split_by_tokens(text, max_tokens, encoding)) or [(text, 0)]


def plan_batches(
    texts: Sequence[str],
    *,
    batch_size: int,
    batch_tokens: int,
    max_input_tokens: int,
    encoding: tiktoken.Encoding,
) -> Plan:
    """Split over-limit texts and group pieces, in order, into requests within both bounds.

    A piece is also capped at `batch_tokens`, so every request is within the token budget. An
    empty text is sent as one space, since OpenAI rejects empty inputs; it counts as one token.

    A token is at least one byte, so a text of at most `limit` bytes needs no split, and its bytes
    bound its tokens: it is only tokenized (`Piece.tokens` then exact) when that bound would take a
    request over `batch_tokens`, so the batches are those of exact counts. Chunks are ~400 tokens:
    counting every one cost ~48 us a text (~4 s of CPU for the 87k chunks of 20,000 notes).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    limit = min(max_input_tokens, batch_tokens)
    pieces: list[Piece] = []
    bounded: set[int] = set()  # pieces whose `tokens` is the bound, not the count
    for index, text in enumerate(texts):
        size = len(text.encode("utf-8", "surrogatepass"))
        if 0 < size <= limit:
            bounded.add(len(pieces))
            pieces.append(Piece(text, size, index))
            continue
        for part, count in split_text(text, limit, encoding):
            pieces.append(Piece(part or " ", max(count, 1), index))

    def settle(number: int) -> int:
        """Replace a piece's bound by its count; how much smaller that is."""
        bounded.discard(number)
        piece = pieces[number]
        pieces[number] = Piece(piece.text, max(len(encoding.encode_ordinary(piece.text)), 1), piece.source)
        return piece.tokens - pieces[number].tokens

    batches: list[tuple[int, ...]] = []
    current: list[int] = []
    loose: list[int] = []  # pieces of `current` counted by their bound
    used = 0
    for number in range(len(pieces)):
        if current and used + pieces[number].tokens > batch_tokens:  # perhaps only by the bounds: count first
            used -= sum(settle(n) for n in loose)
            loose.clear()
            if number in bounded:
                settle(number)
        if current and (len(current) >= batch_size or used + pieces[number].tokens > batch_tokens):
            batches.append(tuple(current))
            current, loose, used = [], [], 0
        current.append(number)
        if number in bounded:
            loose.append(number)
        used += pieces[number].tokens
    if current:
        batches.append(tuple(current))
    return Plan(tuple(pieces), tuple(batches), len(texts))


def combine(plan: Plan, vectors: Sequence[Sequence[float]]) -> list[Any]:
    """One unit vector per text: its pieces' unit vectors averaged by token count, normalised.

    Raises ProviderError for a zero, NaN or infinite vector, which must never be stored.
    """
    if len(vectors) != len(plan.pieces):
        raise ProviderError(f"expected {len(plan.pieces)} vectors, got {len(vectors)}")
    parts: list[list[tuple[Any, int]]] = [[] for _ in range(plan.texts)]
    for piece, raw in zip(plan.pieces, vectors, strict=True):
        vector = unit(raw)
        if vector is None:
            raise ProviderError("the provider returned a zero or non-finite vector")
        parts[piece.source].append((vector, piece.tokens))
    result: list[Any] = []
    for pieces in parts:
        if len(pieces) == 1:  # the usual case: the text's own unit vector
            result.append(pieces[0][0])
            continue
        if len({len(vector) for vector, _ in pieces}) != 1:
            raise ProviderError("the provider returned vectors of different lengths for one text")
        combined = unit(sum(vector * tokens for vector, tokens in pieces))
        if combined is None:
            raise ProviderError("the provider's vectors for one text cancel out to zero")
        result.append(combined)
    return result


def embed_planned(plan: Plan, request: Callable[[list[str]], list[list[float]]], *, width: int = 1) -> list[Any]:
    """Send each batch through `request` (one provider call), up to `width` at once; check the counts, combine.

    The first failure is raised once the requests before it are in; requests still in flight then
    finish in the background and their answers are dropped.
    """
    calls = [functools.partial(request, [plan.pieces[i].text for i in batch]) for batch in plan.batches]
    vectors: list[Any] = []
    for batch, answer in zip(plan.batches, in_flight(calls, width), strict=True):
        if len(answer) != len(batch):
            raise ProviderError(f"the provider returned {len(answer)} vectors for {len(batch)} inputs")
        vectors.extend(answer)
    return combine(plan, vectors)


def in_flight(calls: Iterable[Callable[[], T]], width: int) -> Iterator[T]:
    """The calls' results in order, with up to `width` of them running at once (each raises as it would).

    `calls` may be lazy: the next one is taken (on the consumer's thread) when a slot frees. Daemon
    threads, not an executor: a call stuck in an SDK must never hold up the exit of the process
    (an executor's threads are joined at exit).
    """
    if width <= 1:
        for call in calls:
            yield call()
        return
    started: deque[tuple[threading.Event, list[tuple[bool, Any]]]] = deque()

    def start(call: Callable[[], T]) -> None:
        done, box = threading.Event(), list[tuple[bool, Any]]()

        def run() -> None:
            try:
                box.append((True, call()))
            except BaseException as exc:  # handed to the consumer, in order
                box.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=run, name="clawmem-embed-request", daemon=True).start()
        started.append((done, box))

    waiting = iter(calls)
    for call in itertools.islice(waiting, width):
        start(call)
    while started:
        done, box = started.popleft()
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        following = next(waiting, None)
        if following is not None:
            start(following)
        yield value


