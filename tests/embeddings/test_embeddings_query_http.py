"""A query's vector by one plain request: what the SDK would send, read as it would, failing as it would.

`clawmem search` without a daemon embeds its query this way instead of importing the provider's SDK
(~0.5 s of CPU for openai). The same request through the SDK is the reference: both go to a fake server
on 127.0.0.1, which records what each sent.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_http import (
    FakeServer,
    Reply,
    assert_unit,
    fake_server,
    gemini_reply,
    no_proxy,
    openai_reply,
    voyage_reply,
)

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.gemini import GeminiProvider
from clawmem_index.embeddings.openai import OpenAIProvider
from clawmem_index.embeddings.query_http import HTTPCall, ReplyTooLarge, post_json
from clawmem_index.embeddings.remote import RemoteProvider
from clawmem_index.embeddings.voyage import VoyageProvider
from clawmem_index.errors import ProviderError, ProviderTimeout

__all__ = ["fake_server", "no_proxy"]

pytestmark = pytest.mark.usefixtures("no_proxy")

KEY = "sk-query-0123456789"
CREDENTIALS = ("authorization", "x-goog-api-key", "openai-organization", "openai-project", "x-team")


def openai(server: FakeServer, **overrides: Any) -> RemoteProvider:
    server.default = openai_reply
    settings = EmbeddingSettings(provider="openai", base_url=f"{server.url}/v1", api_key=KEY, dimensions=8,
                                 max_retries=1, headers={"X-Team": "blue"}, **overrides)
    return OpenAIProvider(settings, environ={"OPENAI_ORG_ID": "org-1", "OPENAI_PROJECT_ID": "proj-2"},
                          sleep=lambda _: None)


def gemini(server: FakeServer, **overrides: Any) -> RemoteProvider:
    server.default = gemini_reply
    settings = EmbeddingSettings(provider="gemini", base_url=server.url, api_key=KEY, dimensions=8, max_retries=1,
                                 headers={"X-Team": "blue"}, **overrides)
    return GeminiProvider(settings, environ={}, sleep=lambda _: None)


def voyage(server: FakeServer, **overrides: Any) -> RemoteProvider:
    server.default = voyage_reply
    settings = EmbeddingSettings(provider="voyage", base_url=f"{server.url}/v1", api_key=KEY, dimensions=8,
                                 max_retries=1, **overrides)
    return VoyageProvider(settings, environ={}, sleep=lambda _: None)


PROVIDERS = pytest.mark.parametrize("make", [openai, gemini, voyage], ids=["openai", "gemini", "voyage"])


@pytest.mark.parametrize(("make", "model"), [(openai, ""), (gemini, ""), (gemini, "tunedModels/mine"), (voyage, "")],
                         ids=["openai", "gemini", "gemini-tuned-model", "voyage"])
def test_the_plain_request_is_the_one_the_sdk_sends(fake_server: FakeServer,
                                                    make: Callable[..., RemoteProvider], model: str) -> None:
    provider = make(fake_server, **({"model": model} if model else {}))
    plain = provider.embed_query("which server is staging")
    through_sdk = provider._embed(["which server is staging"], "query")[0]
    sent_plain, sent_sdk = fake_server.requests
    assert "python-urllib" in sent_plain.headers["user-agent"].lower()  # the plain route, not the SDK's
    assert "python-urllib" not in sent_sdk.headers["user-agent"].lower()
    assert (sent_plain.method, sent_plain.path, sent_plain.body) == (sent_sdk.method, sent_sdk.path, sent_sdk.body)
    assert {k: v for k, v in sent_plain.headers.items() if k in CREDENTIALS} == \
        {k: v for k, v in sent_sdk.headers.items() if k in CREDENTIALS}
    assert KEY in (sent_plain.headers.get("authorization", "") + sent_plain.headers.get("x-goog-api-key", ""))
    assert list(plain) == pytest.approx(list(through_sdk))
    assert_unit(plain)


@PROVIDERS
def test_a_query_too_long_for_one_input_goes_through_the_sdk(fake_server: FakeServer,
                                                             make: Callable[..., RemoteProvider]) -> None:
    provider = make(fake_server)
    vector = provider.embed_query("staging " * 4000)  # 32,000 bytes: over Gemini's and OpenAI's input limit
    assert_unit(vector)
    agents = {request.headers["user-agent"].lower() for request in fake_server.requests}
    assert agents and not any("python-urllib" in agent for agent in agents)


def test_an_empty_query_is_sent_as_one_space(fake_server: FakeServer) -> None:
    openai(fake_server).embed_query("")
    assert fake_server.requests[0].body["input"] == [" "]


def test_a_redirect_is_not_followed(fake_server: FakeServer) -> None:
    provider = openai(fake_server)
    fake_server.script(Reply(status=307, json={"error": {"message": "moved"}},
                             headers={"Location": f"{fake_server.url}/elsewhere"}))
    with pytest.raises(ProviderError, match="HTTP 307") as info:
        provider.embed_query("x")
    assert type(info.value) is ProviderError and [r.path for r in fake_server.requests] == ["/v1/embeddings"]


def test_an_error_says_what_the_server_said_without_the_key(fake_server: FakeServer) -> None:
    provider = voyage(fake_server)
    fake_server.script(Reply(status=400, json={"detail": f"model unknown for key {KEY}"}))
    with pytest.raises(ProviderError, match="HTTP 400.*model unknown") as info:
        provider.embed_query("x")
    assert KEY not in str(info.value)


def test_an_answer_that_is_not_a_vector_is_a_malformed_response(fake_server: FakeServer) -> None:
    provider = gemini(fake_server)
    fake_server.default = lambda request: Reply(json={"embeddings": []})
    with pytest.raises(ProviderError, match="malformed response"):
        provider.embed_query("x")
    assert len(fake_server.requests) == 1  # not worth another try


def test_an_answer_is_read_up_to_its_bound(fake_server: FakeServer) -> None:
    fake_server.default = lambda request: Reply(body=b'{"data": "' + b"x" * 5000 + b'"}')
    call = HTTPCall(f"{fake_server.url}/v1/embeddings", {}, {"input": ["x"]})
    with pytest.raises(ReplyTooLarge):
        post_json(call, timeout=5, max_bytes=4096)
    assert post_json(call, timeout=5, max_bytes=8192) == {"data": "x" * 5000}


@pytest.fixture
def hangs_up() -> Iterator[str]:
    """A server that reads each request and closes the connection without a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    stop.set()
    listener.close()
    thread.join(5)


def test_a_server_that_hangs_up_is_retried_then_given_up_on(hangs_up: str) -> None:
    waits: list[float] = []
    settings = EmbeddingSettings(provider="openai", base_url=hangs_up, api_key=KEY, dimensions=8, max_retries=2)
    with pytest.raises(ProviderTimeout, match="after 3 attempts: connection failed"):
        OpenAIProvider(settings, environ={}, sleep=waits.append).embed_query("x")
    assert len(waits) == 2


def test_the_proxy_of_the_environment_is_used(fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the SDKs do (httpx trusts the environment): the request goes to the proxy, for the server it names."""
    fake_server.default = openai_reply
    monkeypatch.setenv("HTTP_PROXY", fake_server.url)
    monkeypatch.setenv("NO_PROXY", "")
    settings = EmbeddingSettings(provider="openai", base_url="http://embeddings.invalid/v1", api_key=KEY,
                                 dimensions=8, max_retries=0)
    assert_unit(OpenAIProvider(settings, environ={}).embed_query("x"))
    [request] = fake_server.requests
    assert request.path == "http://embeddings.invalid/v1/embeddings"
