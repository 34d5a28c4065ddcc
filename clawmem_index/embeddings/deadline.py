"""Query embeddings with a deadline, so a slow or hung provider costs a search seconds, not minutes.

A search embeds its query through the provider (a network call for remote models). An SDK call
cannot be interrupted, so it runs on a thread of its own and the search waits for it at most
`timeout` seconds; past that, it answers with keyword results and a warning, and the call ends in
the background (its SDK timeout bounds it) with its result dropped. At most `slots` such calls are
in flight: while that many are stuck, further searches do not wait at all. The threads are daemon
threads, so a stuck network call never holds up the exit of `clawmem search` either; a local model's
call is different: the exit waits for the decode in flight (about a second at most), since exiting
under it crashes the process, and the model is loaded before the clock starts, since the load points
the process's output at /dev/null (clawmem_index.embeddings.local).

Loading the model (a local model's weights in the child process of the daemon, a remote SDK's import)
is not the query's own time either: until the provider has loaded once, a search first waits up to
`first_use` seconds for that, then the usual `timeout` for its vector (a busy machine's first search
after a start fell back to keyword-only).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from clawmem_index.embeddings.base import EmbeddingProvider, ProviderBase, ProviderInfo
from clawmem_index.errors import ClawmemError, ProviderError, ProviderTimeout

__all__ = ["QueryDeadline"]


class QueryDeadline(ProviderBase):
    """An EmbeddingProvider whose `embed_query` gives up after `timeout` seconds (documents pass through)."""

    def __init__(self, provider: EmbeddingProvider, timeout: float, *, slots: int = 2, first_use: float = 0.0) -> None:
        self.provider = provider
        self.timeout = timeout
        self.first_use = first_use
        self._slots = threading.BoundedSemaphore(slots)
        self._loaded = threading.Event()  # the provider's `warm` has returned once

    @property
    def info(self) -> ProviderInfo:
        return self.provider.info

    def embed_documents(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        return self.provider.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        self.provider.load()  # a local model: its load silences the process (see LocalProvider.load)
        if not self._slots.acquire(blocking=False):
            raise ProviderTimeout("the embedding provider has not answered earlier queries yet")
        outcome: list[object] = []
        done = threading.Event()
        loaded = threading.Event()  # the model is there, or the call ended without it

        def call() -> None:
            try:
                if not self._loaded.is_set():
                    self.provider.warm()
                    self._loaded.set()
                loaded.set()
                outcome.append(self.provider.embed_query(text))
            except BaseException as exc:  # handed to the waiting search, if it still waits
                outcome.append(exc)
            finally:
                loaded.set()
                done.set()
                self._slots.release()

        loading = not self._loaded.is_set()
        threading.Thread(target=call, name="clawmem-query-embed", daemon=True).start()
        if loading and not loaded.wait(self.first_use):
            raise ProviderTimeout(f"the embedding model was still loading after {self.first_use:g} s")
        if not done.wait(self.timeout):
            raise ProviderTimeout(f"the embedding provider did not answer within {self.timeout:g} s")
        result = outcome[0]
        if isinstance(result, ClawmemError):
            raise result
        if isinstance(result, BaseException):
            raise ProviderError(f"embedding the query failed: {type(result).__name__}: {result}")
        return result  # type: ignore[return-value]

