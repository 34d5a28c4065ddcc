"""A command that embeds nothing imports no provider SDK and loads no model.

Importing an SDK costs up to a second (openai ~1 s, voyageai ~0.4 s) and the local model ~100 MB:
the provider's identity, which the index fingerprint needs on every command, is known from the
settings and the GGUF header alone. Each command runs as a user runs it, in its own process, and
reports which provider modules it had imported when it exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_http import FakeServer, fake_server, no_proxy, openai_reply

__all__ = ["fake_server", "no_proxy"]

SDK_MODULES = ("openai", "google.genai", "voyageai", "llama_cpp")

# Runs the CLI, then prints the provider modules it imported (atexit runs after click's sys.exit).
_PROBE = """
import atexit, json, sys
atexit.register(lambda: print("IMPORTED " + json.dumps(sorted(m for m in {modules!r} if m in sys.modules)),
                              file=sys.stderr))
sys.argv = ["clawmem", *sys.argv[1:]]
from clawmem_index.cli import main
main()
"""


def run(*args: str, env: dict[str, str],
        modules: tuple[str, ...] = SDK_MODULES) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    probe = _PROBE.format(modules=modules)
    out = subprocess.run([sys.executable, "-c", probe, *args], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    marker = [line for line in out.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert marker, out.stderr
    return out, json.loads(marker[-1].removeprefix("IMPORTED "))


@pytest.fixture
def notes(workspace: Path) -> Path:
    (workspace / "MEMORY.md").write_text("# Memory\nThe staging server is called pinecone.\n")
    (workspace / "memory" / "2026-11-20.md").write_text("Deploys go through staging first.\n")
    return workspace


def remote_env(notes: Path, tmp_path: Path, server: FakeServer) -> dict[str, str]:
    return {"CLAWMEM_WORKSPACE": str(notes), "CLAWMEM_INDEX": str(tmp_path / "index.sqlite"),
            "CLAWMEM_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{server.url}/v1",
            "CLAWMEM_SOCKET": str(tmp_path / "none.sock")}


@pytest.mark.usefixtures("no_proxy")
def test_openai_sdk_is_imported_only_by_commands_that_embed(notes: Path, tmp_path: Path,
                                                            fake_server: FakeServer) -> None:
    fake_server.default = lambda request: openai_reply(request, dims=1536)
    env = remote_env(notes, tmp_path, fake_server)
    first, imported = run("index", env=env)
    assert first.returncode == 0, first.stderr
    assert "openai" in imported  # the first index embeds: the SDK is used, so imported
    requests = len(fake_server.requests)
    assert requests > 0

    for command in (["index"], ["status"], ["search", "--mode", "bm25", "staging"]):
        out, imported = run(*command, env=env)
        assert out.returncode == 0, (command, out.stderr)
        assert imported == [], command
    assert len(fake_server.requests) == requests

    # Hybrid: the query is embedded by one plain request, without the SDK (~0.5 s of CPU) or httpx.
    out, imported = run("search", "--json", "which server is staging", env=env, modules=(*SDK_MODULES, "httpx"))
    assert out.returncode == 0, out.stderr
    assert imported == []
    assert [r.body["input"] for r in fake_server.requests[requests:]] == [["which server is staging"]]
    answer = json.loads(out.stdout)
    assert answer["results"][0]["path"] == "MEMORY.md"
    assert answer["results"][0]["vector_score"] is not None


def test_local_model_is_loaded_only_by_commands_that_embed(notes: Path, tmp_path: Path) -> None:
    env = {"CLAWMEM_WORKSPACE": str(notes), "CLAWMEM_INDEX": str(tmp_path / "index.sqlite"),
           "CLAWMEM_PROVIDER": "local", "CLAWMEM_SOCKET": str(tmp_path / "none.sock")}
    first, imported = run("index", env=env)
    assert first.returncode == 0, first.stderr
    assert imported == ["llama_cpp"]

    for command in (["index"], ["status", "--json"], ["search", "--mode", "bm25", "staging"]):
        out, imported = run(*command, env=env)
        assert out.returncode == 0, (command, out.stderr)
        assert imported == [], command
    status = json.loads(run("status", "--json", env=env)[0].stdout)
    assert status["fresh"] is True and status["dims"] == 384


def test_keyword_commands_load_no_numpy(notes: Path, tmp_path: Path) -> None:
    """numpy costs a CLI ~60 ms and a chunking worker ~12 MB: only summing scores or vectors loads it."""
    env = {"CLAWMEM_WORKSPACE": str(notes), "CLAWMEM_INDEX": str(tmp_path / "index.sqlite"),
           "CLAWMEM_PROVIDER": "none", "CLAWMEM_SOCKET": str(tmp_path / "none.sock")}
    assert run("index", env=env)[0].returncode == 0
    for command in (["status"], ["search", "--mode", "bm25", "staging"], ["search", "staging"]):
        out, imported = run(*command, env=env, modules=("numpy",))
        assert out.returncode == 0, (command, out.stderr)
        assert imported == [], command


def test_commands_that_only_read_load_no_write_path(notes: Path, tmp_path: Path) -> None:
    """The sync engine, chunker and tokenizer cost a CLI ~14 ms to import, the provider registry ~9 ms: a search
    or status does not load them (the registry is not needed when the provider is "none")."""
    env = {"CLAWMEM_WORKSPACE": str(notes), "CLAWMEM_INDEX": str(tmp_path / "index.sqlite"),
           "CLAWMEM_PROVIDER": "none", "CLAWMEM_SOCKET": str(tmp_path / "none.sock")}
    write_path = ("clawmem_index.engine.sync", "clawmem_index.text.chunking", "clawmem_index.engine.backfill",
                  "tiktoken")
    out, imported = run("index", env=env, modules=write_path)
    assert out.returncode == 0, out.stderr
    assert "clawmem_index.engine.sync" in imported
    for command in (["status"], ["search", "staging"], ["get", "MEMORY.md"]):
        out, imported = run(*command, env=env, modules=(*write_path, "clawmem_index.embeddings.registry"))
        assert out.returncode == 0, (command, out.stderr)
        assert imported == [], command  # nor, with provider "none", any provider code


def test_the_settings_parser_is_loaded_only_for_a_settings_file(notes: Path, tmp_path: Path) -> None:
    """tomllib costs every command ~2 ms; a workspace without `clawmem.toml` does not need it."""
    env = {"CLAWMEM_WORKSPACE": str(notes), "CLAWMEM_INDEX": str(tmp_path / "index.sqlite"),
           "CLAWMEM_PROVIDER": "none", "CLAWMEM_SOCKET": str(tmp_path / "none.sock"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    out, imported = run("status", env=env, modules=("tomllib",))
    assert (out.returncode, imported) == (0, []), out.stderr
    (notes / "clawmem.toml").write_text("[search]\nmax_results = 3\n")
    out, imported = run("status", env=env, modules=("tomllib",))
    assert (out.returncode, imported) == (0, ["tomllib"]), out.stderr


@pytest.mark.parametrize(("factory", "key", "sdk"), [
    ("clawmem_index.embeddings.openai:OpenAIProvider", "OPENAI_API_KEY", "openai"),
    ("clawmem_index.embeddings.gemini:GeminiProvider", "GEMINI_API_KEY", "google.genai"),
    ("clawmem_index.embeddings.voyage:VoyageProvider", "VOYAGE_API_KEY", "voyageai"),
])
def test_a_remote_provider_knows_its_identity_without_its_sdk(factory: str, key: str, sdk: str) -> None:
    module, name = factory.split(":")
    code = f"""
import sys
from clawmem_index.config import EmbeddingSettings
from {module} import {name} as Provider
provider = Provider(EmbeddingSettings(provider="x"), environ={{"{key}": "k-123"}})
info = provider.info
before = "{sdk}" in sys.modules
provider._client
print(info.provider, info.dims > 0, bool(info.endpoint), before, "{sdk}" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1:] == ["True", "True", "False", "True"]


# A Python thread that has finished (the pending check's, the query deadline's) leaves `threading`'s count a
# moment before its OS thread leaves /proc: the count is polled until a deadline. A BLAS pool's threads never leave.
_THREADS_PROBE = """
import atexit, os, sys, threading, time
def native() -> None:
    deadline = time.monotonic() + 5
    while (extra := len(os.listdir("/proc/self/task")) - threading.active_count()) and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"NUMPY {'numpy' in sys.modules} NATIVE {extra}", file=sys.stderr)
atexit.register(native)
sys.argv = ["clawmem", *sys.argv[1:]]
from clawmem_index.cli import main
main()
"""


@pytest.mark.usefixtures("no_proxy")
@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not Path("/proc/self/task").is_dir(),
                    reason="a BLAS thread pool needs two cores to start, and /proc to be counted")
def test_a_hybrid_search_starts_no_blas_threads(notes: Path, tmp_path: Path, fake_server: FakeServer) -> None:
    """numpy's OpenBLAS starts a thread per core at import (~0.1 s of CPU), for one query vector's products."""
    fake_server.default = lambda request: openai_reply(request, dims=1536)
    env = {**{k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"},
           **remote_env(notes, tmp_path, fake_server)}
    assert subprocess.run([sys.executable, "-m", "clawmem_index", "index"], env=env, capture_output=True,
                          timeout=120).returncode == 0
    out = subprocess.run([sys.executable, "-c", _THREADS_PROBE, "search", "--json", "which server is staging"],
                         env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "NUMPY True NATIVE 0" in out.stderr  # numpy did its work, on this thread alone
