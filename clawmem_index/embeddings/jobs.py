"""Batch jobs: many texts embedded as one asynchronous provider job, for large backfills (half the price).

`BatchEmbedder` is what a provider offers (OpenAI's Batch API, Gemini's batch embeddings); the
rest is what those two share. A job is submitted by one process and may be polled by another (the
daemon, or the next `clawmem index`), so everything needed to read its answers back travels with
the job: each request's key is the caller's id, or, for a piece of a text over the model's input
limit, `id#index/count:tokens`, which is enough to recombine the pieces exactly as the synchronous
path does (`batching.combine`: token-weighted mean of unit vectors).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from clawmem_index.embeddings.base import unit
from clawmem_index.embeddings.batching import Piece, Plan, combine, split_text
from clawmem_index.errors import ProviderError
from clawmem_index.text.tokens import get_encoding

__all__ = ["MAX_ID_CHARS", "BatchEmbedder", "JobState", "Submitted", "assemble", "job_capacity", "pack_job",
           "piece_key"]

T = TypeVar("T")

# OpenAI caps a custom_id at 64 characters; a piece's suffix (`#12/34:8191`) needs up to 16 more.
MAX_ID_CHARS = 48

_PIECE_KEY = re.compile(r"(?P<id>.+)#(?P<index>\d+)/(?P<count>\d+):(?P<tokens>\d+)")


@dataclass(frozen=True)
class JobState:
    state: Literal["running", "completed", "failed"]
    vectors: Mapping[str, Sequence[float]]  # custom id -> raw (not normalised) vector; only when completed
    missing: tuple[str, ...] = ()  # custom ids a completed job has no vector for (their lines failed)
    detail: str = ""  # provider's status words or error, for logs and status (never a key)


@runtime_checkable
class BatchEmbedder(Protocol):
    """A provider that can embed many texts as one asynchronous job (cheaper, for large backfills)."""

    @property
    def max_batch_items(self) -> int: ...  # most texts one job may carry

    # (custom id, text) -> job id; raises ProviderError
    def submit_batch(self, items: Sequence[tuple[str, str]]) -> str: ...

    # raises ProviderError on transport/auth failure
    def poll_batch(self, job_id: str) -> JobState: ...

    # best effort
    def cancel_batch(self, job_id: str) -> None: ...


@dataclass(frozen=True)
class Submitted:
    """What the submitting process knows of a job and its provider does not tell: every id it was given
    (those left out included, so they can be reported missing) and, for Gemini, the keys in request order."""

    ids: tuple[str, ...]
    keys: tuple[str, ...] = ()


def job_capacity(dims: int, *, most: int, floats: int) -> int:
    """Items per job: the provider's count limit, fewer for wide vectors.

    A completed job's vectors are read and handed over at once; `floats` bounds that memory. An
    unknown size (0) counts as 3,072, the widest model either provider has.
    """
    return max(1, min(most, floats // (dims or 3072)))


def piece_key(custom_id: str, index: int, count: int, tokens: int) -> str:
    return f"{custom_id}#{index}/{count}:{tokens}"


def pack_job(
    items: Sequence[tuple[str, str]],
    *,
    max_input_tokens: int,
    max_requests: int,
    max_bytes: int,
    encode: Callable[[str, str], tuple[T, int]],
) -> tuple[list[T], list[str]]:
    """The job's requests (`encode(key, text)` gives one and its size in bytes) and the ids left out.

    A text over `max_input_tokens` becomes several requests, cut as the synchronous path cuts it
    (so its vector does not depend on the path). Texts whose requests would take the job over
    `max_requests` or `max_bytes` are left out whole, to be reported missing. An empty text is
    sent as one space, as `plan_batches` does. Raises ValueError for ids that are empty, repeated,
    longer than MAX_ID_CHARS or shaped like a piece key, and ProviderError when nothing fits.
    """
    if not items:
        raise ValueError("a batch job needs at least one text")
    seen: set[str] = set()
    for custom_id, _ in items:
        if not custom_id or len(custom_id) > MAX_ID_CHARS or custom_id in seen or _PIECE_KEY.fullmatch(custom_id):
            raise ValueError(f"unusable batch id {custom_id!r}: ids must be unique, 1 to {MAX_ID_CHARS} characters, "
                             "and not end like a piece key (#i/n:t)")
        seen.add(custom_id)
    encoding = get_encoding("cl100k_base")
    requests: list[T] = []
    left_out: list[str] = []
    used = 0
    for custom_id, text in items:
        parts = split_text(text, max_input_tokens, encoding)
        if len(parts) == 1:
            keyed = [(custom_id, parts[0][0] or " ")]
        else:
            keyed = [(piece_key(custom_id, index, len(parts), max(count, 1)), part or " ")
                     for index, (part, count) in enumerate(parts)]
        encoded = [encode(key, piece) for key, piece in keyed]
        size = sum(length for _, length in encoded)
        if len(requests) + len(encoded) > max_requests or used + size > max_bytes:
            left_out.append(custom_id)
            continue
        requests.extend(request for request, _ in encoded)
        used += size
    if not requests:
        raise ProviderError(f"none of {len(items)} texts fits in one batch job "
                            f"({max_requests} requests, {max_bytes} bytes)")
    return requests, left_out


def assemble(
    answers: Mapping[str, Any],
    failed: Iterable[str],
    *,
    accept: Callable[[Any], bool],
    expected: Iterable[str] = (),
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """One vector per id from a completed job's answers by key, and the ids without one.

    A whole text's vector is returned raw; a split text's pieces are combined (a unit vector).
    An id is missing when any of its keys failed, a piece did not come back, or a vector is
    zero, non-finite or of the wrong size (`accept` says), or its pieces cancel out. Ids in `expected` that no answer
    mentions (left out, or lost) are missing too.
    """
    missing = {_source(key) for key in failed}
    vectors: dict[str, Any] = {}
    pieces: dict[str, dict[int, tuple[int, Any]]] = {}
    counts: dict[str, int] = {}
    for key, vector in answers.items():
        usable = accept(vector) and unit(vector) is not None
        match = _PIECE_KEY.fullmatch(key)
        if match is None:
            if usable:
                vectors[key] = vector
            else:
                missing.add(key)
            continue
        source = match["id"]
        if not usable:
            missing.add(source)
            continue
        pieces.setdefault(source, {})[int(match["index"])] = (int(match["tokens"]), vector)
        counts[source] = int(match["count"])
    for source, parts in pieces.items():
        if source in missing or sorted(parts) != list(range(counts[source])):
            missing.add(source)
            continue
        plan = Plan(tuple(Piece("", parts[i][0], 0) for i in sorted(parts)), (), 1)
        try:
            vectors[source] = combine(plan, [parts[i][1] for i in sorted(parts)])[0]
        except ProviderError:  # the pieces cancel out: no direction to store
            missing.add(source)
    missing.update(custom_id for custom_id in expected if custom_id not in vectors)
    missing.difference_update(vectors)
    return vectors, tuple(sorted(missing))


def _source(key: str) -> str:
    match = _PIECE_KEY.fullmatch(key)
    return key if match is None else match["id"]
