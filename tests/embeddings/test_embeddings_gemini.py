"""GeminiProvider against a fake server, through the real `google-genai` SDK."""

from __future__ import annotations

import functools
import subprocess
import sys
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
    gemini_reply,
    no_proxy,
    query_route,
    vector_for,
)

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import normalize
from clawmem_index.embeddings.gemini import GeminiProvider, split_base_url
from clawmem_index.errors import AuthError, ProviderError, ProviderTimeout, RateLimited

__all__ = ["fake_server", "no_proxy", "query_route"]

KEY = "AIza-test-0123456789-SECRET"
PATH = "/v1beta/models/gemini-embedding-001:batchEmbedContents"
pytestmark = pytest.mark.usefixtures("no_proxy", "query_route")


@pytest.fixture
def server(fake_server: FakeServer) -> Iterator[FakeServer]:
    fake_server.default = gemini_reply
    yield fake_server


def make(server: FakeServer, sleeps: list[float] | None = None, *, environ: dict[str, str] | None = None,
         **overrides: Any) -> GeminiProvider:
    values: dict[str, Any] = {"provider": "gemini", "base_url": server.url, "api_key": KEY, "dimensions": 8,
                              "max_retries": 2, "timeout": 5.0,
                              "concurrency": 1}
    values.update(overrides)
    return GeminiProvider(EmbeddingSettings(**values), environ=environ or {},
                          sleep=(sleeps if sleeps is not None else []).append)


def expected(text: str, dims: int = 8) -> list[float]:
    unit = normalize(vector_for(text, dims))
    assert unit is not None
    return unit


def google_error(code: int, status: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=code, json={"error": {"code": code, "message": message, "status": status}},
                 headers=headers or {})


def texts_of(request: Recorded) -> list[str]:
    return [item["content"]["parts"][0]["text"] for item in request.body["requests"]]


def test_documents_use_the_document_task_type(server: FakeServer) -> None:
    vectors = make(server).embed_documents(["alpha", "beta"])
    assert vectors == [pytest.approx(expected("alpha")), pytest.approx(expected("beta"))]
    for vector in vectors:
        assert_unit(vector)
    [request] = server.requests
    assert request.path == PATH
    assert request.headers["x-goog-api-key"] == KEY
    assert texts_of(request) == ["alpha", "beta"]
    for item in request.body["requests"]:
        assert item["model"] == "models/gemini-embedding-001"
        assert item["taskType"] == "RETRIEVAL_DOCUMENT"
        assert item["outputDimensionality"] == 8


def test_queries_use_the_query_task_type(server: FakeServer) -> None:
    assert make(server).embed_query("what") == pytest.approx(expected("what"))
    [item] = server.requests[0].body["requests"]
    assert item["taskType"] == "RETRIEVAL_QUERY"


def test_default_dims_and_no_output_dimensionality(server: FakeServer) -> None:
    server.default = functools.partial(gemini_reply, dims=3072)
    provider = make(server, dimensions=0)
    assert provider.info.dims == 3072 and server.requests == []
    provider.embed_query("x")
    assert "outputDimensionality" not in server.requests[0].body["requests"][0]


def test_other_model_and_versioned_base_url(server: FakeServer) -> None:
    provider = make(server, base_url=f"{server.url}/v1/", model="text-embedding-004")
    provider.embed_query("x")
    assert server.requests[0].path == "/v1/models/text-embedding-004:batchEmbedContents"
    assert provider.info.endpoint == f"{server.url}/v1"


def test_split_base_url() -> None:
    assert split_base_url("https://generativelanguage.googleapis.com") == (
        "https://generativelanguage.googleapis.com", "v1beta")
    assert split_base_url("https://proxy.example/gemini/v1beta/") == ("https://proxy.example/gemini", "v1beta")
    assert split_base_url("https://proxy.example/v1alpha") == ("https://proxy.example", "v1alpha")
    assert split_base_url("https://proxy.example/v1") == ("https://proxy.example", "v1")


def test_headers_are_sent_and_the_endpoint_hides_secrets(server: FakeServer) -> None:
    provider = make(server, headers={"X-Region": "eu", "Authorization": "Bearer proxy-secret"})
    provider.embed_query("x")
    assert server.requests[0].headers["x-region"] == "eu"
    assert provider.info.endpoint == f"{server.url}/v1beta; x-region=eu"


@pytest.mark.parametrize("variable", ["GEMINI_API_KEY", "GOOGLE_API_KEY"])
def test_key_from_the_environment(server: FakeServer, variable: str) -> None:
    make(server, api_key="", environ={variable: "env-key-123"}).embed_query("x")
    assert server.requests[0].headers["x-goog-api-key"] == "env-key-123"


def test_gemini_key_wins_over_google_key(server: FakeServer) -> None:
    make(server, api_key="", environ={"GOOGLE_API_KEY": "google-1", "GEMINI_API_KEY": "gemini-1"}).embed_query("x")
    assert server.requests[0].headers["x-goog-api-key"] == "gemini-1"


def test_no_key_is_refused() -> None:
    with pytest.raises(ProviderError, match="GEMINI_API_KEY"):
        GeminiProvider(EmbeddingSettings(provider="gemini"), environ={})


def test_batches_by_count(server: FakeServer) -> None:
    texts = [f"t{i}" for i in range(5)]
    make(server, batch_size=2).embed_documents(texts)
    assert [texts_of(r) for r in server.requests] == [texts[:2], texts[2:4], texts[4:]]


def test_over_limit_input_is_split(server: FakeServer) -> None:
    long = " ".join(f"w{i}" for i in range(150))
    [vector] = make(server, batch_tokens=64).embed_documents([long])
    pieces = [t for r in server.requests for t in texts_of(r)]
    assert len(pieces) > 1 and "".join(pieces) == long
    assert_unit(vector)


def test_429_with_retry_after_is_honoured(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.script(google_error(429, "RESOURCE_EXHAUSTED", "quota", {"Retry-After": "3"}))
    assert make(server, sleeps).embed_query("x") == pytest.approx(expected("x"))
    assert sleeps == [3.0] and len(server.requests) == 2


def test_500_is_retried_then_succeeds(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.script(google_error(500, "INTERNAL", "oops"))
    make(server, sleeps).embed_query("x")
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_gives_up_after_the_bound(server: FakeServer) -> None:
    server.default = lambda request: google_error(503, "UNAVAILABLE", "overloaded")
    with pytest.raises(ProviderTimeout, match="after 3 attempts: HTTP 503.*overloaded"):
        make(server).embed_query("x")
    assert len(server.requests) == 3


def test_rate_limit_gives_up_with_rate_limited(server: FakeServer) -> None:
    server.default = lambda request: google_error(429, "RESOURCE_EXHAUSTED", "quota")
    with pytest.raises(RateLimited):
        make(server, max_retries=1).embed_query("x")
    assert len(server.requests) == 2


@pytest.mark.parametrize("code", [401, 403])
def test_auth_errors_are_not_retried_and_hide_the_key(server: FakeServer, code: int) -> None:
    server.script(google_error(code, "PERMISSION_DENIED", f"API key not valid: {KEY}"))
    with pytest.raises(AuthError) as info:
        make(server).embed_query("x")
    assert len(server.requests) == 1 and KEY not in str(info.value)


def test_malformed_json_is_a_provider_error(server: FakeServer) -> None:
    server.script(Reply(body=b"<html>proxy error</html>"))
    with pytest.raises(ProviderError, match="malformed response") as info:
        make(server).embed_query("x")
    assert type(info.value) is ProviderError and len(server.requests) == 1


def test_timeouts_are_retried_then_give_up(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.default = lambda request: Reply(delay=3.0)
    with pytest.raises(ProviderTimeout, match="after 2 attempts: timed out"):
        make(server, sleeps, max_retries=1, timeout=0.2).embed_query("x")
    assert len(server.requests) == 2 and len(sleeps) == 1


def test_a_missing_vector_is_an_error(server: FakeServer) -> None:
    server.default = lambda request: Reply(json={"embeddings": [{"values": []}]})
    with pytest.raises(ProviderError, match="empty vector"):
        make(server).embed_query("x")


def test_importing_the_module_does_not_import_the_sdk() -> None:
    code = "import sys, clawmem_index.embeddings.gemini; assert 'google.genai' not in sys.modules, 'SDK imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
