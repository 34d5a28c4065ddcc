"""The one seam between clawmem and any embedding model.

Everything above this protocol (sync, search, the daemon) is tested with `FakeProvider`; every
real provider is tested against a fake HTTP server or a real GGUF file.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["KEYWORDS_ONLY", "EmbeddingProvider", "ProviderBase", "ProviderInfo", "normalize", "pack", "unit", "unpack"]

KEYWORDS_ONLY = "embedding provider is 'none': keyword search only"  # why there is no provider, when none was asked for


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
    Raises `clawmem_index.errors.ProviderError` (or a subclass) when it gives up. What a provider may
    do beyond that (`ProviderBase`, which every provider derives from) is asked of each the same way.
    """

    @property
    def info(self) -> ProviderInfo: ...

    def embed_documents(self, texts: Sequence[str]) -> Sequence[Sequence[float]]: ...

    def embed_query(self, text: str) -> Sequence[float]: ...

    @property
    def preferred_batch(self) -> int | None: ...

    @property
    def official_endpoint(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def load(self) -> None: ...

    def warm(self) -> None: ...

    def close(self) -> None: ...


class ProviderBase:
    """What a provider may do beyond embedding, as one that does none of it: every provider derives from this,
    so the engine asks each the same way instead of probing for attributes."""

    official_endpoint = False  # the vendor's own service, whose batch API can be counted on (`batch_enabled`)

    @property
    def preferred_batch(self) -> int | None:
        """How many texts to hand it per call (see `embed_pending`); None: the caller's batch."""
        return None

    @property
    def closed(self) -> bool:
        """Released for good (a reload closed it): a holder should take the current provider."""
        return False

    def load(self) -> None:  # noqa: B027 (a no-op unless a provider has a model to load)
        """Load what a query needs and nothing more, before its deadline's clock starts (a local model)."""

    def warm(self) -> None:  # noqa: B027
        """Load what the first call would (an SDK, a model): a command that embeds nothing never calls it; the
        daemon calls it in the background so a query does not wait."""

    def close(self) -> None:  # noqa: B027
        """Release what it holds (a model process, an SDK client's connections)."""


def unit(vector: Sequence[float]) -> NDArray[np.float64] | None:
    """The vector L2-normalised (a float64 array); None for a zero, NaN or infinite one, never stored as a match.

    numpy, imported here only: a backfill handles millions of floats, and a Python loop over them
    costs more than the provider's own answer.
    """
    import numpy as np

    values = np.asarray(vector, dtype=np.float64)
    total = float(values @ values)
    if not math.isfinite(total) or total <= 0.0 or values.ndim != 1:
        return None
    return values / math.sqrt(total)


def normalize(vector: Sequence[float]) -> list[float] | None:
    """`unit` as a list of floats."""
    values = unit(vector)
    return None if values is None else values.tolist()


def pack(vector: Sequence[float] | NDArray[np.floating]) -> bytes:
    """float32 little-endian blob, the format sqlite-vec and the cache store."""
    import numpy as np

    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(blob: bytes) -> list[float]:
    values = array("f")
    values.frombytes(blob)
    return values.tolist()
