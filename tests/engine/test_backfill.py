"""Large backfills as provider batch jobs: submitted past a threshold, kept in the index, collected, or given up."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import RecordingLog, wait_until
from fake_http import FakeServer, OpenAIBatches, no_proxy  # noqa: F401 (a fixture)

from clawmem_index.config import Settings, with_overrides
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.embeddings.jobs import BatchEmbedder, JobState
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ProviderTimeout
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.embedder import Embedder
from clawmem_index.service.writer import Run, Writer


class BatchFake(FakeProvider):
    """The fake model with a batch API whose jobs finish (or fail) when the test says."""

    max_batch_items = 1000

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(dims=16, **kwargs)
        self.jobs: dict[str, dict[str, Any]] = {}
        self.cancelled: list[str] = []
        self.poll_failures = 0
        self._ids = itertools.count(1)
        self._jobs_lock = threading.Lock()

    def submit_batch(self, items: Sequence[tuple[str, str]]) -> str:
        with self._jobs_lock:
            job_id = f"batch-{next(self._ids)}"
            self.jobs[job_id] = {"items": list(items), "state": "running", "polls": 0}
            return job_id

    def poll_batch(self, job_id: str) -> JobState:
        with self._jobs_lock:
            if self.poll_failures:
                self.poll_failures -= 1
                raise ProviderTimeout("batch status request timed out")
            job = self.jobs[job_id]
            job["polls"] += 1
            if job["state"] != "completed":
                return JobState(job["state"], {}, (), "in_progress" if job["state"] == "running" else "quota")
            return JobState("completed", {cid: self._vector(text) for cid, text in job["items"]})

    def cancel_batch(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def finish(self, state: str = "completed") -> None:
        with self._jobs_lock:
            for job in self.jobs.values():
                job["state"] = state


def notes(write: Any, n: int, prefix: str = "note") -> None:
    for i in range(n):
        write(f"memory/{prefix}{i}.md", f"# {prefix} {i}\nword{prefix}{i} and a few more words\n")


def batched(settings: Settings, **batch: Any) -> Settings:
    return with_overrides(settings, batch={"enabled": "on", "threshold": 20, "wait": False, "poll_interval": 0.01,
                                           **batch})


def test_below_the_threshold_requests_are_synchronous(settings: Settings, write: Any) -> None:
    notes(write, 10)
    provider = BatchFake()
    report = MemoryIndex(batched(settings), provider=provider).sync()
    assert provider.jobs == {} and report.embedded == 10 and provider.documents_embedded == 10


def test_a_large_backfill_goes_to_a_batch_job_that_survives_a_restart(settings: Settings, write: Any) -> None:
    notes(write, 30)
    provider = BatchFake()
    first = MemoryIndex(batched(settings), provider=provider)
    report = first.sync()
    assert len(provider.jobs) == 1 and report.batch_jobs == 1 and report.batch_chunks == 30
    assert provider.documents_embedded == 0  # nothing sent twice: the job's chunks wait for the job
    status = first.status()
    assert status["pending_embeddings"] == 30 and status["fresh"] is False
    hits = first.search(SearchRequest("wordnote7", mode="bm25"))["results"]
    assert [hit["path"] for hit in hits] == ["memory/note7.md"]  # keyword search serves meanwhile
    first.close()
    provider.finish()
    later = MemoryIndex(batched(settings), provider=provider)  # a new process: the job is in the index
    report = later.sync()
    assert report.embedded == 30 and report.batch_jobs == 0 and provider.documents_embedded == 0
    assert later.status()["pending_embeddings"] == 0
    later.close()


def test_a_failed_job_falls_back_to_requests(settings: Settings, write: Any) -> None:
    notes(write, 25)
    provider = BatchFake()
    index = MemoryIndex(batched(settings), provider=provider)
    index.sync()
    provider.finish("failed")
    report = index.sync()
    assert report.embedded == 25 and provider.documents_embedded == 25
    assert any("failed: quota" in note for note in report.batch_notes)
    index.close()


def test_a_job_that_outlives_its_timeout_is_cancelled_and_its_chunks_go_synchronous(settings: Settings,
                                                                                 write: Any) -> None:
    notes(write, 25)
    provider = BatchFake()
    index = MemoryIndex(batched(settings, timeout_minutes=1e-6), provider=provider)
    index.sync()
    report = index.sync()
    assert provider.cancelled == ["batch-1"] and report.embedded == 25
    assert any("cancelled" in note for note in report.batch_notes)
    index.close()


def test_a_poll_that_fails_keeps_the_job(settings: Settings, write: Any) -> None:
    notes(write, 25)
    provider = BatchFake()
    index = MemoryIndex(batched(settings), provider=provider)
    index.sync()
    provider.finish()
    provider.poll_failures = 1
    report = index.sync()
    assert report.batch_jobs == 1 and report.embedded == 0  # still out there: asked again next time
    report = index.sync()
    assert report.embedded == 25 and provider.documents_embedded == 0
    index.close()


def test_index_can_wait_for_its_jobs(settings: Settings, write: Any) -> None:
    notes(write, 25)
    provider = BatchFake()
    heard: list[str] = []

    def finish_when_waited_for(message: str) -> None:
        heard.append(message)
        if message.startswith("waiting"):
            provider.finish()

    report = MemoryIndex(batched(settings, wait=True), provider=provider).sync(notify=finish_when_waited_for)
    assert report.embedded == 25 and report.batch_jobs == 0 and provider.documents_embedded == 0
    assert heard[0] == "submitted 1 batch job(s) for 25 chunks"


def test_a_rebuild_keeps_the_jobs_it_waits_for(settings: Settings, write: Any) -> None:
    notes(write, 25)
    provider = BatchFake()
    index = MemoryIndex(batched(settings), provider=provider)
    index.sync()
    index.reindex()
    assert index.reader().batch_jobs.job_count() == 1
    provider.finish()
    assert index.sync().embedded == 25 and provider.documents_embedded == 0
    index.close()


def test_the_daemon_polls_its_jobs_and_embeds_new_notes_meanwhile(settings: Settings, write: Any) -> None:
    notes(write, 25)
    provider = BatchFake()
    index = MemoryIndex(batched(settings), provider=provider)
    log = RecordingLog()
    embedder = Embedder(lambda: index, log=log)

    def on_run(run: Run) -> None:
        if run.error is None:
            embedder.wake()

    writer = Writer(lambda: index, log=log, on_run=on_run)
    writer.start()
    embedder.start()
    try:
        writer.wait_sync(writer.request_sync("startup"), timeout=10)
        wait_until(lambda: provider.jobs and index.status()["pending_embeddings"] == 25, message="the job")
        write("memory/urgent.md", "# Urgent\nthe quokka escaped\n")
        writer.wait_sync(writer.request_sync("change"), timeout=10)
        wait_until(lambda: index.status()["pending_embeddings"] == 25, message="the new note embedded at once")
        assert provider.documents_embedded == 1
        wait_until(lambda: all(job["polls"] >= 2 for job in provider.jobs.values()), message="repeated polls")
        provider.finish()
        wait_until(lambda: index.status()["pending_embeddings"] == 0, message="the job's vectors")
        assert provider.documents_embedded == 1
    finally:
        writer.stop(5)
        embedder.stop(5)
        index.close()


def test_the_fake_is_a_batch_embedder() -> None:
    assert isinstance(BatchFake(), BatchEmbedder) and not isinstance(FakeProvider(), BatchEmbedder)


@pytest.mark.usefixtures("no_proxy")
def test_clawmem_index_hands_a_backfill_to_openai_batches_and_collects_it(workspace: Path, write: Any,
                                                                          tmp_path: Path) -> None:
    """The real openai SDK against a fake Files + Batches service on 127.0.0.1, through the CLI."""
    notes(write, 30)
    service = OpenAIBatches()
    config = tmp_path / "clawmem.toml"
    with FakeServer(service) as server:
        config.write_text(f'[embedding]\nprovider = "openai"\nbase_url = "{server.url}/v1"\napi_key = "sk-test"\n'
                          'dimensions = 8\n[batch]\nenabled = "on"\nthreshold = 20\nwait = false\n')

        def clawmem(*args: str) -> subprocess.CompletedProcess[str]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
            return subprocess.run([sys.executable, "-m", "clawmem_index", *args, "--workspace", str(workspace),
                                   "--config", str(config), "--index", str(tmp_path / "i.sqlite")], capture_output=True,
                                  text=True, env=env, timeout=120, check=False)

        out = clawmem("index")
        assert out.returncode == 0, out.stderr
        assert "submitted 1 batch job(s) for 30 chunks" in out.stderr
        assert "30 chunks are being embedded by 1 batch job(s)" in out.stderr
        assert len(service.lines()) == 30 and not any(r.path.endswith("/embeddings") for r in server.requests)
        status = json.loads(clawmem("status", "--json").stdout)
        assert status["batch_jobs"] == 1 and status["pending_embeddings"] == 30 and not status["fresh"]
        service.complete()
        out = clawmem("index")
        assert out.returncode == 0 and "30 embedded" in out.stderr, out.stderr
        status = json.loads(clawmem("status", "--json").stdout)
        assert status["batch_jobs"] == 0 and status["pending_embeddings"] == 0 and status["fresh"]
        assert not any(r.path.endswith("/embeddings") for r in server.requests)  # nothing sent synchronously


def test_auto_uses_batch_jobs_only_at_the_vendors_own_endpoint(settings: Settings, write: Any) -> None:
    """An OpenAI-compatible server seldom has batch endpoints: `auto` sends it requests, `on` tries jobs."""
    from clawmem_index.config import EmbeddingSettings
    from clawmem_index.embeddings.openai import OpenAIProvider
    from clawmem_index.engine.backfill import batch_enabled

    compatible = OpenAIProvider(EmbeddingSettings(base_url="http://127.0.0.1:9/v1", api_key="k"), environ={})
    official = OpenAIProvider(EmbeddingSettings(api_key="k"), environ={})
    auto, on, off = (with_overrides(settings, batch={"enabled": value}).batch for value in ("auto", "on", "off"))
    assert not batch_enabled(compatible, auto) and batch_enabled(compatible, on)
    assert batch_enabled(official, auto) and not batch_enabled(official, off)
    assert not batch_enabled(FakeProvider(), on)
