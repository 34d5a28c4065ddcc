"""A deterministic, dependency-free provider for tests and for people building on clawmem.

Vectors are hashed bags of lowercase word stems plus an optional synonym table, so texts that
share words (or declared synonyms) are close: enough to test vector and hybrid ranking without a
model. It counts its calls so tests can prove what was (not) embedded.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence

import xxhash

from clawmem_index.embeddings.base import ProviderBase, ProviderInfo

__all__ = ["FakeProvider"]

_WORD = re.compile(r"\w+", re.UNICODE)


class FakeProvider(ProviderBase):
    def __init__(self, dims: int = 64, model: str = "fake-1", synonyms: Mapping[str, str] | None = None,
                 fail: bool = False) -> None:
        self._info = ProviderInfo(provider="fake", model=model, dims=dims, endpoint="")
        self.synonyms = {k.lower(): v.lower() for k, v in (synonyms or {}).items()}
        self.fail = fail
        self.document_calls = 0
        self.documents_embedded = 0
        self.query_calls = 0
        self._lock = threading.Lock()

    @property
    def info(self) -> ProviderInfo:
        return self._info

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self._check()
        with self._lock:
            self.document_calls += 1
            self.documents_embedded += len(texts)
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        self._check()
        with self._lock:
            self.query_calls += 1
        return self._vector(text)

    def _check(self) -> None:
        if self.fail:
            from clawmem_index.errors import ProviderTimeout

            raise ProviderTimeout("fake provider is down")

    def _vector(self, text: str) -> list[float]:
        dims = self._info.dims
        vec = [0.0] * dims
        for word in _WORD.findall(text.lower()):
            word = self.synonyms.get(word, word)
            stem = word[:5]
            h = xxhash.xxh3_64_intdigest(stem.encode("utf-8", "surrogatepass"))
            vec[h % dims] += 1.0 if (h >> 32) & 1 else -1.0
        if not any(vec):
            vec[0] = 1e-3
        return vec
