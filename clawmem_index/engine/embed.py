"""Give the chunks that wait for a vector one: from the embedding cache first, then from the provider.

The provider is called outside any transaction, one batch ahead of the one being written, so keyword
syncs never wait for it; a provider failure leaves the rest pending, retried by the next pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clawmem_index.embeddings.base import EmbeddingProvider, pack, unit
from clawmem_index.embeddings.batching import in_flight
from clawmem_index.errors import ProviderError
from clawmem_index.index.interface import IndexStore
from clawmem_index.text.annotations import embedding_text

if TYPE_CHECKING:
    from clawmem_index.engine.parse import Progress

__all__ = ["EMBEDDING_ERROR", "EMBED_BATCH", "FIRST_BATCH", "embed_pending"]

EMBED_BATCH = 64  # chunks per provider call and per vector transaction (progress moves once per batch)
# The first batch of a pass is small: its vectors (MEMORY.md's, the latest day's) land and the pass
# has a rate for its ETA within seconds, not after a full batch (128 chunks: ~16 s for a local model).
FIRST_BATCH = 16


@dataclass(frozen=True)
class _Batch:
    """Pending chunks read together, with what the cache has for them and the texts it lacks."""

    pending: list[tuple[int, str, str]]
    cached: dict[str, bytes]
    missing: dict[str, str]
    borrowed: frozenset[str] = frozenset()  # texts an earlier batch still in flight asks for


def embed_pending(store: IndexStore, provider: EmbeddingProvider, *,  # noqa: C901
                  cache_max_entries: int, batch: int = EMBED_BATCH, progress: Progress | None = None,
                  should_stop: Callable[[], bool] | None = None,
                  fingerprint: str | None = None, cache_only: bool = False,
                  exclude: Collection[str] = (), index_progress: Progress | None = None,
                  precision: str = "float32") -> tuple[int, str | None]:
    """Give every chunk without a vector one, cache first. Returns (embedded, error or None).

    The provider is called outside any transaction (on a thread of its own, one batch ahead of the
    one being written), so other writers (keyword syncs) never wait for it and a batch's vectors are
    stored while the next batch's are made. Each batch is written in one short transaction that
    first checks the index still has `fingerprint` (a rebuild may have replaced it) and stores a
    vector only for a chunk that still waits for that very text. A provider failure stops the pass
    and leaves the rest pending (kept in the index, retried by the next pass): nothing is lost, and
    keyword search is unaffected. `cache_only` fills what the embedding cache knows and makes no
    provider call; chunks whose hash is in `exclude` (a batch job embeds them) are only filled from
    the cache. `progress` is told after each batch: FIRST_BATCH chunks first, then EMBED_BATCH, or the
    provider's `preferred_batch` when larger (a remote provider's requests in flight at once); `index_progress`
    about the vector index's upkeep at the end (a cells build past 131k vectors takes 30-65 s at 1M).
    `precision`: how a new vector table stores its vectors (`embedding.precision`).
    """
    info = provider.info
    key = info.provider_key
    size = max(batch, provider.preferred_batch or batch)
    total = store.pending_embeddings()

    asked: set[str] = set()  # texts sent in this pass
    lent: set[str] = set()  # ... that a later batch waits for too
    made: dict[str, bytes | None] = {}  # the vectors of those, once they came back

    def batches() -> Iterator[_Batch]:  # read on this thread, as the pass goes
        cursor = 0
        first = True
        while not (should_stop and should_stop()):
            pending = store.embeddings.pending_chunks(min(size, FIRST_BATCH) if first else size, after=cursor)
            first = False
            if not pending:
                return
            cursor = pending[-1][0]
            cached = store.cache.cached_embeddings(info.provider, info.model, key, (h for _, h, _ in pending),
                                                   touch=False)
            missing: dict[str, str] = {}
            borrowed: set[str] = set()
            for _, h, text in pending:
                if h in cached or h in exclude:
                    continue
                if h in asked:  # not in the cache yet because its batch is still in flight: never ask twice
                    borrowed.add(h)
                else:
                    missing.setdefault(h, text)
            if cache_only:
                missing, borrowed = {}, set()
            asked.update(missing)
            lent.update(borrowed)
            yield _Batch(pending, cached, missing, frozenset(borrowed))

    def fetch(item: _Batch) -> tuple[_Batch, dict[str, bytes | None]]:
        texts = [embedding_text(text) for text in item.missing.values()]  # an annotation is no part of the meaning
        vectors = provider.embed_documents(texts) if texts else []
        directions = (unit(vec) for vec in vectors)
        return item, {h: pack(d) if d is not None else None for h, d in zip(item.missing, directions, strict=True)}

    done = 0
    error: str | None = None
    try:
        for item, fresh in in_flight((functools.partial(fetch, item) for item in batches()), 2):
            made.update((h, blob) for h, blob in fresh.items() if h in lent)
            known = {**item.cached, **fresh, **{h: made[h] for h in item.borrowed if h in made}}
            with store.transaction():
                if fingerprint is not None and store.meta.get("fingerprint") != fingerprint:
                    break  # replaced by a rebuild for another model: these vectors belong to no chunk of it
                dims = next((len(blob) // 4 for blob in known.values() if blob is not None), 0)
                if dims:
                    store.vectors.ensure(dims, precision)
                    store.cache.set_vector_owner(info.provider, info.model, key)
                given = store.embeddings.store_vectors([(seq, h, known[h]) for seq, h, _ in item.pending if h in known],
                                            info.model)
                done += len(given)
                given_seqs = {seq for seq, _ in given}
                held = {h for seq, h, _ in item.pending if seq in given_seqs}
                store.cache.uncache(info.provider, info.model, key, held & item.cached.keys())  # stored once: in it
                store.cache.cache_embeddings(info.provider, info.model, key, (  # for a chunk that changed meanwhile,
                    # or every one when the cache is the fleet's (caches_stored_vectors)
                    (h, blob) for h, blob in fresh.items()
                    if blob is not None and (store.caches_stored_vectors or h not in held)))
            if progress and (given or not cache_only):  # a cache-only pass that found nothing has not moved
                progress(done, total)
    except ProviderError as exc:
        error = str(exc)
    if not cache_only and (error is not None or not (should_stop and should_stop())):
        _record_failure(store, error, fingerprint)  # a pass stopped short (the daemon stopping) says nothing
    if not (should_stop and should_stop()):
        store.vectors.build_index(index_progress)  # a backend that indexes vectors whole (pgvector's HNSW) does it now
    if cache_max_entries:
        with store.transaction():
            store.cache.prune_cache(cache_max_entries)
    return done, error


EMBEDDING_ERROR = "embedding_error"  # meta: why the last pass that called the provider stopped (absent: it did not)


def _record_failure(store: IndexStore, error: str | None, fingerprint: str | None) -> None:
    """Keep the provider's last failure in the index, so that an answer missing vectors can say why (a key the
    provider refuses never 'still being made'); a pass that reached the provider's end clears it. Read first: a
    pass with nothing to change (the usual one) takes no write transaction."""
    if store.meta.get(EMBEDDING_ERROR) == error:
        return
    with store.transaction():
        if fingerprint is not None and store.meta.get("fingerprint") != fingerprint:
            return  # the index was replaced meanwhile: this pass's outcome is not about it
        if error is None:
            if store.meta.get(EMBEDDING_ERROR) is not None:
                store.meta.delete(EMBEDDING_ERROR)
        elif store.meta.get(EMBEDDING_ERROR) != error:
            store.meta.set(EMBEDDING_ERROR, error)
