"""Large backfills through a provider's batch API: submit, remember, collect.

When at least `batch.threshold` chunks wait for a vector the embedding cache does not have, and
the provider can (OpenAI, Gemini: `clawmem_index.embeddings.jobs.BatchEmbedder`), their texts go to the
provider as asynchronous batch jobs (cheaper, and no request rate to respect) instead of
synchronous requests. Each job is recorded in the index with the chunk hashes it embeds, so
nothing is lost across a restart: whoever runs next (the daemon's embedding thread, or `clawmem
index`) polls it. A completed job's vectors go to the embedding cache, from which the waiting
chunks are then filled; a job that fails, expires or outlives `batch.timeout_minutes` is dropped
(cancelled first if it still runs) and its chunks are embedded by ordinary synchronous requests.
Keyword search serves throughout, and so does vector search for everything already embedded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clawmem_index.config import BatchSettings
from clawmem_index.embeddings.base import EmbeddingProvider, pack, unit
from clawmem_index.embeddings.jobs import BatchEmbedder
from clawmem_index.errors import ProviderError
from clawmem_index.index.interface import IndexStore
from clawmem_index.index.store import JobRow
from clawmem_index.text.annotations import embedding_text

__all__ = ["JobsReport", "advance", "batch_capable", "batch_enabled", "covered"]


@dataclass
class JobsReport:
    """What one round of `advance` did, and what is still out at the provider."""

    submitted: int = 0
    completed: int = 0
    collected: int = 0  # vectors that came back into the cache
    failed: list[str] = field(default_factory=list)
    running: int = 0
    waiting_chunks: int = 0  # distinct chunk texts that running jobs will embed

    @property
    def busy(self) -> bool:
        return self.running > 0


def batch_capable(provider: EmbeddingProvider | None) -> bool:
    return isinstance(provider, BatchEmbedder)


def batch_enabled(provider: EmbeddingProvider | None, settings: BatchSettings) -> bool:
    """`on`: whenever the provider can; `auto`: only against the vendor's own endpoint (an OpenAI-compatible
    server seldom has the Files and Batches endpoints, and asking would cost every large backfill a failure)."""
    if settings.enabled == "off" or not batch_capable(provider):
        return False
    return settings.enabled == "on" or (provider is not None and provider.official_endpoint)


def covered(store: IndexStore, provider: EmbeddingProvider) -> set[str]:
    """Chunk hashes that running jobs will embed: synchronous passes leave them to the jobs."""
    info = provider.info
    return {h for job in store.batch_jobs.jobs(info.provider, info.model, info.provider_key) for h in job.hashes}


def advance(store: IndexStore, provider: EmbeddingProvider, settings: BatchSettings, *, submit: bool = True,
            due_only: bool = False, clock: Callable[[], float] = time.time) -> JobsReport:
    """Poll the jobs (with `due_only`, only those not polled for `batch.poll_interval`: the daemon
    comes here after every edit), collect the finished ones, and submit new ones when enough waits.

    Provider failures while polling or submitting are reported, never raised: the chunks stay
    pending, and synchronous requests (or the next round) take over.
    """
    report = JobsReport()
    if not batch_enabled(provider, settings):
        return report
    jobs_provider: BatchEmbedder = provider  # type: ignore[assignment]
    info = provider.info
    for job in store.batch_jobs.jobs(info.provider, info.model, info.provider_key):
        _poll(store, jobs_provider, job, settings, clock(), report, due_only)
    if submit and not report.failed:  # after a failed job, its chunks go synchronous rather than to a new job
        _submit(store, jobs_provider, settings, clock, report)
    report.waiting_chunks = len(covered(store, provider))
    return report


def _poll(store: IndexStore, provider: BatchEmbedder, job: JobRow, settings: BatchSettings, now: float,
          report: JobsReport, due_only: bool) -> None:
    if due_only and now - job.polled_at < settings.poll_interval:
        report.running += 1  # submitted or polled recently: not due yet
        return
    try:
        state = provider.poll_batch(job.id)
    except ProviderError as exc:
        with store.transaction():
            store.batch_jobs.touch_job(job.id, job.state, f"poll failed: {exc}")
        report.running += 1
        return
    if state.state == "running":
        if now - job.submitted_at <= settings.timeout_minutes * 60:
            with store.transaction():
                store.batch_jobs.touch_job(job.id, "running", state.detail)
            report.running += 1
            return
        try:
            provider.cancel_batch(job.id)
        except ProviderError:
            pass  # it expires at the provider anyway; nothing here waits for it any more
        _drop(store, job, report, f"job {job.id} still running after {settings.timeout_minutes:g} min: cancelled")
        return
    if state.state == "completed":
        report.collected += _collect(store, provider, job, state.vectors)
        report.completed += 1
        with store.transaction():
            store.batch_jobs.drop_job(job.id)
        if state.missing:
            report.failed.append(f"job {job.id}: {len(state.missing)} texts came back without a vector")
        return
    _drop(store, job, report, f"job {job.id} {state.state}: {state.detail or 'no reason given'}")


def _collect(store: IndexStore, provider: BatchEmbedder, job: JobRow, vectors: Any) -> int:
    """Store a completed job's vectors in the cache (the waiting chunks are filled from there)."""
    blobs = {}
    for h in job.hashes:
        direction = unit(vectors[h]) if h in vectors else None
        if direction is not None:
            blobs[h] = pack(direction)
    with store.transaction():
        store.cache.cache_embeddings(job.provider, job.model, job.provider_key, blobs.items())
    return len(blobs)


def _drop(store: IndexStore, job: JobRow, report: JobsReport, why: str) -> None:
    with store.transaction():
        store.batch_jobs.drop_job(job.id)
    report.failed.append(why)


def _submit(store: IndexStore, provider: BatchEmbedder, settings: BatchSettings, clock: Callable[[], float],
            report: JobsReport) -> None:
    info = provider.info  # type: ignore[attr-defined]
    if report.running >= settings.concurrency:
        return
    waiting = store.embeddings.uncached_pending(info.provider, info.model, info.provider_key,
                                     exclude=covered(store, provider))  # type: ignore[arg-type]
    if len(waiting) < settings.threshold:
        return
    items = sorted((h, embedding_text(text)) for h, text in waiting.items())  # as embed_pending sends them
    size = max(1, provider.max_batch_items)
    for start in range(0, len(items), size):
        if report.running >= settings.concurrency:
            return
        chunk = items[start:start + size]
        try:
            job_id = provider.submit_batch(chunk)
        except ProviderError as exc:
            report.failed.append(f"submitting a batch job failed: {exc}")
            return
        now = clock()
        with store.transaction():
            store.batch_jobs.add_job(JobRow(job_id, info.provider, info.model, info.provider_key,
                                            tuple(h for h, _ in chunk), now, now))
        report.submitted += 1
        report.running += 1
