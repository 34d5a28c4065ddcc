"""The one seam between clawmem and any embedding model.

Everything above this protocol (sync, search, the daemon) is tested with `FakeProvider`; every
real provider is tested against a fake HTTP server or a real GGUF file.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["EmbeddingProvider", "ProviderInfo", "normalize", "pack", "unpack"]


@dataclass(frozen=True)
class ProviderInfo:
    """What identifies a provider's vectors: two equal infos give interchangeable vectors.

    `endpoint` is the base URL plus the names and values of non-secret headers (never an API key);
    it is part of the index fingerprint and of the embedding cache key (`provider_key`). `dims` is
    the declared vector size, 0 for a model whose size only its first answer tells: an identity must
    be known without a network request, so that an index can be built while its provider is down.
    """

    provider: str
    model: str
    dims: int
    endpoint: str = ""

    @property
    def provider_key(self) -> str:
        import xxhash

        return xxhash.xxh3_64_hexdigest(f"{self.endpoint}\0{self.dims}".encode())


@runtime_checkable
class EmbeddingProvider(Protocol):
    """An embedding model. Implementations batch, split over-limit inputs and retry internally.

    `embed_documents` returns one vector per input text, in order, each of `info.dims` floats.
    Raises `clawmem.errors.ProviderError` (or a subclass) when it gives up.
    """

    @property
    def info(self) -> ProviderInfo: ...

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def normalize(vector: Sequence[float]) -> list[float] | None:
    """L2-normalise; None for a zero, NaN or infinite vector, which must never be stored as a match.

    Sums in C (`map(operator.mul)`): a Python-level loop costs more than the provider's own answer
    for large backfills. Float32-sized values squared in float64 neither overflow nor vanish.
    """
    total = sum(map(operator.mul, vector, vector))
    if not math.isfinite(total) or total <= 0.0:
        return None
    if abs(total - 1.0) < 1e-9:  # already a unit vector (every provider but the fake returns one)
        return list(vector)
    scale = 1.0 / math.sqrt(total)
    return [x * scale for x in vector]


def pack(vector: Sequence[float]) -> bytes:
    """float32 little-endian blob, the format sqlite-vec and the cache store."""
    return array("f", vector).tobytes()


def unpack(blob: bytes) -> list[float]:
    values = array("f")
    values.frombytes(blob)
    return values.tolist()
