"""VoyageProvider against a fake server, through the real `voyageai` SDK."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_http import FakeServer, Reply, assert_unit, fake_server, no_proxy, query_route, vector_for, voyage_reply

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import normalize
from clawmem_index.embeddings.voyage import VoyageProvider
from clawmem_index.errors import AuthError, ConfigError, ProviderError, ProviderTimeout, RateLimited

__all__ = ["fake_server", "no_proxy", "query_route"]

KEY = "pa-test-0123456789-SECRET"
pytestmark = pytest.mark.usefixtures("no_proxy", "query_route")


@pytest.fixture
def server(fake_server: FakeServer) -> Iterator[FakeServer]:
    fake_server.default = voyage_reply
    yield fake_server


def make(server: FakeServer, sleeps: list[float] | None = None, *, environ: dict[str, str] | None = None,
         **overrides: Any) -> VoyageProvider:
    values: dict[str, Any] = {"provider": "voyage", "base_url": f"{server.url}/v1", "api_key": KEY,
                              "dimensions": 8, "max_retries": 2, "timeout": 5.0,
                              "concurrency": 1}
    values.update(overrides)
    return VoyageProvider(EmbeddingSettings(**values), environ=environ or {},
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
    assert request.path == "/v1/embeddings"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "voyage-4-large"
    assert request.body["input"] == ["alpha", "beta"]
    assert request.body["input_type"] == "document"
    assert request.body["output_dimension"] == 8
    assert provider.info.endpoint == f"{server.url}/v1"


def test_queries_use_the_query_input_type(server: FakeServer) -> None:
    assert make(server).embed_query("what") == pytest.approx(expected("what"))
    assert server.requests[0].body["input_type"] == "query"


def test_default_dims_and_no_output_dimension(server: FakeServer) -> None:
    server.default = functools.partial(voyage_reply, dims=1024)
    provider = make(server, dimensions=0)
    assert provider.info.dims == 1024 and server.requests == []
    assert len(provider.embed_query("x")) == 1024
    assert server.requests[0].body["output_dimension"] is None


def test_key_from_the_environment(server: FakeServer) -> None:
    make(server, api_key="", environ={"VOYAGE_API_KEY": "pa-env-key"}).embed_query("x")
    assert server.requests[0].headers["authorization"] == "Bearer pa-env-key"


def test_default_endpoint_is_the_sdks() -> None:
    provider = VoyageProvider(EmbeddingSettings(provider="voyage"), environ={"VOYAGE_API_KEY": "pa-env-key"})
    assert provider.info.endpoint == "https://api.voyageai.com/v1"


def test_no_key_is_refused() -> None:
    with pytest.raises(ProviderError, match="VOYAGE_API_KEY"):
        VoyageProvider(EmbeddingSettings(provider="voyage"), environ={})


def test_extra_headers_are_refused_not_dropped(server: FakeServer) -> None:
    with pytest.raises(ConfigError, match="embedding.headers"):
        make(server, headers={"X-Tenant": "acme"})


def test_sdk_local_models_are_refused(server: FakeServer) -> None:
    with pytest.raises(ConfigError, match="voyage-4-nano"):
        make(server, model="voyage-4-nano")


def test_batches_by_count(server: FakeServer) -> None:
    texts = [f"t{i}" for i in range(5)]
    make(server, batch_size=2).embed_documents(texts)
    assert [r.body["input"] for r in server.requests] == [texts[:2], texts[2:4], texts[4:]]


def test_over_limit_input_is_split(server: FakeServer) -> None:
    long = " ".join(f"w{i}" for i in range(150))
    [vector] = make(server, batch_tokens=64).embed_documents([long])
    pieces = [t for r in server.requests for t in r.body["input"]]
    assert len(pieces) > 1 and "".join(pieces) == long
    assert_unit(vector)


def test_429_with_retry_after_is_honoured(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.script(Reply(status=429, json={"detail": "rate limited"}, headers={"Retry-After": "2"}))
    assert make(server, sleeps).embed_query("x") == pytest.approx(expected("x"))
    assert sleeps == [2.0] and len(server.requests) == 2


def test_500_is_retried_then_succeeds(server: FakeServer) -> None:
    sleeps: list[float] = []
    server.script(Reply(status=500, json={"detail": "oops"}), Reply(status=502, json={"detail": "gateway"}))
    make(server, sleeps).embed_query("x")
    assert len(server.requests) == 3 and len(sleeps) == 2


def test_gives_up_after_the_bound(server: FakeServer) -> None:
    server.default = lambda request: Reply(status=503, json={"detail": "overloaded"})
    with pytest.raises(ProviderTimeout, match="after 3 attempts: HTTP 503"):
        make(server).embed_query("x")
    assert len(server.requests) == 3


def test_rate_limit_gives_up_with_rate_limited(server: FakeServer) -> None:
    server.default = lambda request: Reply(status=429, json={"detail": "slow down"})
    with pytest.raises(RateLimited, match="slow down"):
        make(server, max_retries=1).embed_query("x")
    assert len(server.requests) == 2


@pytest.mark.parametrize("code", [401, 403])
def test_auth_errors_are_not_retried_and_hide_the_key(server: FakeServer, code: int) -> None:
    server.script(Reply(status=code, json={"detail": f"Provided API key is invalid: {KEY}"}))
    with pytest.raises(AuthError) as info:
        make(server).embed_query("x")
    assert len(server.requests) == 1 and KEY not in str(info.value)


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


def test_importing_the_module_does_not_import_the_sdk() -> None:
    code = "import sys, clawmem_index.embeddings.voyage; assert 'voyageai' not in sys.modules, 'SDK imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
