"""The query deadline: a slow answer costs a search `timeout` seconds, a model still loading `first_use`."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from clawmem_index.embeddings.deadline import QueryDeadline
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.errors import ProviderTimeout


class LoadsSlowly(FakeProvider):
    """A provider whose `warm` (a model's load) returns when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.warming, self.release = threading.Event(), threading.Event()
        self.warms = 0

    def warm(self) -> None:
        self.warms += 1
        self.warming.set()
        assert self.release.wait(60)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return super().embed_documents(texts)


def test_the_first_query_waits_for_the_model_to_load_beyond_the_query_deadline() -> None:
    provider = LoadsSlowly()
    queries = QueryDeadline(provider, 0.01, first_use=60)
    answers: list[object] = []

    def ask() -> None:
        try:
            answers.append(queries.embed_query("the staging server"))
        except ProviderTimeout as exc:
            answers.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    assert provider.warming.wait(60)
    asking.join(0.5)  # fifty query deadlines
    assert asking.is_alive() and not answers, answers
    provider.release.set()
    asking.join(60)
    assert answers == [provider.embed_query("the staging server")]
    assert queries.embed_query("again") and provider.warms == 1  # loaded once: later queries do not warm


def test_a_model_still_loading_after_the_first_use_deadline_is_said_so() -> None:
    provider = LoadsSlowly()
    queries = QueryDeadline(provider, 0.01, first_use=0.05)
    try:
        with pytest.raises(ProviderTimeout, match="still loading after 0.05 s"):
            queries.embed_query("the staging server")
    finally:
        provider.release.set()


def test_a_provider_that_fails_to_load_fails_the_query_at_once() -> None:
    class Broken(FakeProvider):
        def warm(self) -> None:
            raise ProviderTimeout("the model file is gone")

    with pytest.raises(ProviderTimeout, match="the model file is gone"):
        QueryDeadline(Broken(), 0.01, first_use=60).embed_query("anything")
