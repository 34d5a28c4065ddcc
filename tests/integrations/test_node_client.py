"""integrations/clawmem-client, the Node client, through `node --test`: its own tests against servers that misbehave
on purpose, and its daemon test against a real daemon serving a workspace (so a Python change that breaks the Node
client fails here)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import daemon_settings, running_daemon, short_dir, wait_until

from clawmem_index.config import Settings

PACKAGE = Path(__file__).resolve().parents[2] / "integrations" / "clawmem-client"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def test_the_node_client_passes_its_tests_against_a_real_daemon(workspace: Path, tmp_path: Path, sock_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    (workspace / "MEMORY.md").write_text("# Memory\nPrefer the platypus plan.\n")
    (workspace / "memory" / "ideas.md").write_text("# Ideas\n"
                                                   "A platypus detector. <!-- project: github.com/acme/app -->\n")
    (workspace / "USER.md").write_text("# User\n"
                                       "- Answer in haiku. <!-- trigger: poem, verse --> <!-- importance: 7 -->\n")
    named = tmp_path / "a wörk space"  # the socket's name from a folder name with a space and a non-ASCII letter
    named.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/test")
    derived = dataclasses.replace(Settings(), workspace=named).socket_path
    settings = daemon_settings(workspace, tmp_path, sock_dir)
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        env = {**os.environ, "CLAWMEM_TEST_SOCKET": str(settings.socket_path), "CLAWMEM_TEST_WORKSPACE": str(named),
               "CLAWMEM_TEST_DERIVED": str(derived), "XDG_RUNTIME_DIR": "/run/user/test"}
        out = subprocess.run([node, "--test"], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# fail 0" in out.stdout and "# skipped 0" in out.stdout, out.stdout

