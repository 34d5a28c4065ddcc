"""OpenAIProvider against a fake server, through the real `openai` SDK."""

from __future__ import annotations

import email.utils
import functools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_http import (
    FakeServer,
    Recorded,
    Reply,
    assert_unit,
    fake_server,
    no_proxy,
    openai_reply,
    query_route,
    vector_for,
)

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import normalize
from clawmem_index.embeddings.openai import OpenAIProvider
from clawmem_index.errors import AuthError, ProviderError, ProviderTimeout, RateLimited

__all__ = ["fake_server", "no_proxy", "query_route"]

KEY = "sk-test-0123456789-SECRET"
pytestmark = pytest.mark.usefixtures("no_proxy", "query_route")


@pytest.fixture
def server(fake_server: FakeServer) -> Iterator[FakeServer]:
    fake_server.default = openai_reply
    yield fake_server


def make(server: FakeServer, sleeps: list[float] | None = None, *, environ: dict[str, str] | None = None,
         **overrides: Any) -> OpenAIProvider:
    values: dict[str, Any] = {"provider": "openai", "base_url": f"{server.url}/v1", "api_key": KEY,
                              "dimensions": 8, "max_retries": 2, "timeout": 5.0,
                              "concurrency": 1}
    values.update(overrides)
    return OpenAIProvider(EmbeddingSettings(**values), environ=environ or {},
                          sleep=(sleeps if sleeps is not None else []).append)


def expected(text: str, dims: int = 8) -> list[float]:
    unit = normalize(vector_for(text, dims))
    assert unit is not None
    return unit


def test_documents_request_and_vectors(server: FakeServer) -> None:
    provider = make(server)
    vectors = provider.embed_documents(["alpha", "beta"])
    assert vectors == [pytest.approx(expected("alpha")), pytest.approx(expected("beta"))]
    for vector in vectors:
        assert_unit(vector)
    [request] = server.requests
    assert request.method == "POST" and request.path == "/v1/embeddings"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "text-embedding-3-small"
    assert request.body["input"] == ["alpha", "beta"]
    assert request.body["dimensions"] == 8
    assert request.body["encoding_format"] == "base64"  # decoded by us: the SDK parses JSON floats slowly
    assert request.headers["x-stainless-retry-count"] == "0"


def test_a_server_that_answers_json_floats_anyway_still_works(server: FakeServer) -> None:
    """Some OpenAI-compatible servers ignore encoding_format."""
    server.default = lambda request: openai_reply(Recorded(request.method, request.path, request.headers,
                                                           {**request.body, "encoding_format": "float"}, request.raw))
    assert make(server).embed_query("alpha") == pytest.approx(expected("alpha"))


def test_query_sends_one_input(server: FakeServer) -> None:
    assert make(server).embed_query("what is up") == pytest.approx(expected("what is up"))
    assert server.requests[0].body["input"] == ["what is up"]


def test_default_model_has_known_dims_and_no_dimensions_parameter(server: FakeServer) -> None:
    server.default = functools.partial(openai_reply, dims=1536)
    provider = make(server, dimensions=0)
    assert provider.info.dims == 1536
    assert server.requests == []
    assert len(provider.embed_query("x")) == 1536
    assert "dimensions" not in server.requests[0].body


def test_unknown_model_dims_are_learned_from_its_first_answer_not_a_probe(server: FakeServer) -> None:
    """The identity needs no request (the index must build while the provider is down); the size follows."""
    server.default = functools.partial(openai_reply, dims=12)
    provider = make(server, dimensions=0, model="nomic-embed-text")
    assert provider.info.dims == 0 and provider.vector_dims == 0
    assert server.requests == []
    assert len(provider.embed_documents(["hello"])[0]) == 12
    assert server.requests[0].body["model"] == "nomic-embed-text"
    assert provider.vector_dims == 12 and provider.info.dims == 0  # the fingerprint's identity stays put


def test_a_vector_of_the_wrong_size_is_an_error(server: FakeServer) -> None:
    server.default = functools.partial(openai_reply, dims=1536)
    provider = make(server, dimensions=0, model="text-embedding-3-large")
    with pytest.raises(ProviderError, match="1536-d vector.*expected 3072"):
        provider.embed_query("x")


def test_extra_headers_are_sent_and_only_public_ones_identify_the_endpoint(server: FakeServer) -> None:
    provider = make(server, headers={"X-Tenant": "acme", "X-Api-Key": "proxy-secret-value"})
    provider.embed_query("x")
    headers = server.requests[0].headers
    assert headers["x-tenant"] == "acme" and headers["x-api-key"] == "proxy-secret-value"
    assert provider.info.endpoint == f"{server.url}/v1; x-tenant=acme"
    assert provider.info.provider == "openai" and provider.info.model == "text-embedding-3-small"
    assert KEY not in provider.info.endpoint


def test_key_and_base_url_from_the_environment(server: FakeServer) -> None:
    provider = make(server, api_key="", base_url="",
                    environ={"OPENAI_API_KEY": "sk-env-key-123", "OPENAI_BASE_URL": f"{server.url}/v1/"})
    provider.embed_query("x")
    assert server.requests[0].headers["authorization"] == "Bearer sk-env-key-123"
    assert provider.info.endpoint == f"{server.url}/v1"


def test_no_key_for_openai_itself_is_refused() -> None:
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        OpenAIProvider(EmbeddingSettings(provider="openai"), environ={})


def test_a_compatible_server_needs_no_key(server: FakeServer) -> None:
    make(server, api_key="").embed_query("x")
    assert server.requests[0].headers["authorization"] == "Bearer no-key"


def test_batches_by_count(server: FakeServer) -> None:
    texts = [f"text {i}" for i in range(5)]
    vectors = make(server, batch_size=2).embed_documents(texts)
    assert [r.body["input"] for r in server.requests] == [texts[0:2], texts[2:4], texts[4:]]
    assert vectors == [pytest.approx(expected(t)) for t in texts]


def test_batches_by_token_budget(server: FakeServer) -> None:
    texts = [" ".join(["word"] * 40)] * 3
    make(server, batch_tokens=100).embed_documents(texts)
    assert [len(r.body["input"]) for r in server.requests] == [2, 1]


def test_over_limit_input_is_split_and_averaged(server: FakeServer) -> None:
    long = " ".join(f"w{i}" for i in range(150))
    [vector] = make(server, batch_tokens=64).embed_documents([long])
    pieces = [text for r in server.requests for text in r.body["input"]]
    assert len(pieces) > 1 and "".join(pieces) == long
    from clawmem_index.text.tokens import count_tokens

    assert all(count_tokens(p) <= 64 for p in pieces)
    weights = [count_tokens(p) for p in pieces]
    total = [sum(w * x for w, x in zip(weights, column, strict=True))
             for column in zip(*(expected(p) for p in pieces), strict=True)]
    assert vector == pytest.approx(normalize(total))


def test_429_with_retry_after_is_honoured(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.script(Reply(status=429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "2"}))
    assert make(server, sleeps).embed_query("x") == pytest.approx(expected("x"))
    assert len(server.requests) == 2 and sleeps == [2.0]


def test_retry_after_as_an_http_date_is_honoured(server: FakeServer) -> None:
    sleeps: list[float] = []
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.script(Reply(status=429, json={"error": {"message": "slow down"}}, headers={"Retry-After": when}))
    make(server, sleeps).embed_query("x")
    assert len(sleeps) == 1 and 20 <= sleeps[0] <= 31


def test_500_is_retried_then_succeeds(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.script(Reply(status=500, json={"error": {"message": "oops"}}))
    make(server, sleeps).embed_query("x")
    assert len(server.requests) == 2 and len(sleeps) == 1 and 0 <= sleeps[0] <= 0.5


def test_gives_up_on_server_errors_after_the_bound(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.default = lambda request: Reply(status=503, json={"error": {"message": "overloaded"}})
    with pytest.raises(ProviderTimeout, match="failed after 3 attempts: HTTP 503.*overloaded"):
        make(server, sleeps, max_retries=2).embed_query("x")
    assert len(server.requests) == 3 and len(sleeps) == 2


def test_gives_up_on_rate_limits_after_the_bound(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.default = lambda request: Reply(status=429, json={"error": {"message": "quota"}},
                                           headers={"Retry-After": "1"})
    with pytest.raises(RateLimited, match="after 3 attempts: HTTP 429"):
        make(server, sleeps).embed_query("x")
    assert sleeps == [1.0, 1.0]


def test_auth_errors_are_not_retried_and_never_show_the_key(server: FakeServer) -> None:
    server.script(Reply(status=401, json={"error": {"message": f"Incorrect API key provided: {KEY}"}}))
    with pytest.raises(AuthError) as info:
        make(server).embed_query("x")
    assert len(server.requests) == 1
    assert KEY not in str(info.value) and "HTTP 401" in str(info.value)
    assert info.value.__cause__ is None


def test_403_is_an_auth_error(server: FakeServer) -> None:
    server.script(Reply(status=403, json={"error": {"message": "forbidden"}}))
    with pytest.raises(AuthError):
        make(server).embed_query("x")


def test_400_is_a_plain_provider_error(server: FakeServer) -> None:
    server.script(Reply(status=400, json={"error": {"message": "bad input"}}))
    with pytest.raises(ProviderError, match="bad input") as info:
        make(server).embed_query("x")
    assert type(info.value) is ProviderError and len(server.requests) == 1


def test_malformed_json_is_a_provider_error(server: FakeServer) -> None:
    server.script(Reply(body=b"{not json"))
    with pytest.raises(ProviderError, match="malformed response") as info:
        make(server).embed_query("x")
    assert type(info.value) is ProviderError and len(server.requests) == 1


def test_timeouts_are_retried_then_give_up(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.default = lambda request: Reply(delay=3.0)
    with pytest.raises(ProviderTimeout, match="after 2 attempts: timed out"):
        make(server, sleeps, max_retries=1, timeout=0.2).embed_query("x")
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_a_slow_reply_then_a_fast_one_succeeds(server: FakeServer) -> None:
    server.script(Reply(delay=3.0))
    assert make(server, timeout=0.2).embed_query("x") == pytest.approx(expected("x"))
    assert len(server.requests) == 2


def test_connection_refused_is_retried_then_gives_up() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps: list[float] = []
    settings = EmbeddingSettings(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, dimensions=8, max_retries=1)
    with pytest.raises(ProviderTimeout, match="connection failed"):
        OpenAIProvider(settings, environ={}, sleep=sleeps.append).embed_query("x")
    assert len(sleeps) == 1


def test_a_zero_vector_is_never_returned(server: FakeServer) -> None:
    def zeros(request: Recorded) -> Reply:
        return Reply(json={"data": [{"object": "embedding", "index": 0, "embedding": [0.0] * 8}],
                           "model": "m", "object": "list", "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    server.default = zeros
    with pytest.raises(ProviderError, match="zero"):
        make(server).embed_query("x")


def test_a_short_answer_is_an_error(server: FakeServer) -> None:
    def one(request: Recorded) -> Reply:
        reply = openai_reply(request)
        reply.json["data"] = reply.json["data"][:1]
        return reply

    server.default = one
    with pytest.raises(ProviderError, match="1 vectors for 2 inputs"):
        make(server).embed_documents(["a", "b"])


def test_answers_out_of_order_are_put_back_in_order(server: FakeServer) -> None:
    def reversed_reply(request: Recorded) -> Reply:
        reply = openai_reply(request)
        reply.json["data"].reverse()
        return reply

    server.default = reversed_reply
    assert make(server).embed_documents(["a", "b"]) == [pytest.approx(expected("a")), pytest.approx(expected("b"))]


def test_importing_the_module_does_not_import_the_sdk() -> None:
    code = "import sys, clawmem_index.embeddings.openai; assert 'openai' not in sys.modules, 'SDK imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_requests_are_in_flight_at_once(server: FakeServer) -> None:
    """A backfill keeps `concurrency` requests going: the server sees all four before answering any."""
    together = threading.Barrier(4, timeout=10)

    def answer_when_all_arrived(request: Recorded) -> Reply:
        try:
            together.wait()
        except threading.BrokenBarrierError:
            return Reply(status=400, json={"error": {"message": "the requests came one after another"}})
        return openai_reply(request)

    server.default = answer_when_all_arrived
    texts = [f"text {i}" for i in range(8)]
    provider = make(server, batch_size=2, concurrency=4)
    assert provider.preferred_batch == 8
    assert provider.embed_documents(texts) == [pytest.approx(expected(t)) for t in texts]  # in order
    assert len(server.requests) == 4


def test_a_429_pauses_the_other_requests_in_flight_too(server: FakeServer) -> None:
    told: list[float] = []
    arrivals: dict[str, list[float]] = {}

    def respond(request: Recorded) -> Reply:
        text = request.body["input"][0]
        arrivals.setdefault(text, []).append(time.monotonic())
        if text == "a" and len(arrivals["a"]) == 1:
            told.append(time.monotonic())
            return Reply(status=429, json={"error": {"message": "slow down"}}, headers={"Retry-After": "1"})
        if text == "b":
            return Reply(delay=0.3, json=openai_reply(request).json)
        return openai_reply(request)

    server.default = respond
    provider = OpenAIProvider(EmbeddingSettings(provider="openai", base_url=f"{server.url}/v1", api_key=KEY,
                                                dimensions=8, max_retries=2, batch_size=1, concurrency=2), environ={})
    vectors = provider.embed_documents(["a", "b", "c"])
    assert vectors == [pytest.approx(expected(t)) for t in "abc"]
    # "c" would have gone out as soon as "b" was answered (0.3 s): it waited out the Retry-After instead.
    assert arrivals["c"][0] >= told[0] + 0.9
    assert arrivals["a"][1] >= told[0] + 0.9
