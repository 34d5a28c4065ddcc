"""integrations/openclaw, the OpenClaw memory-slot plugin, through `node --test`: its own tests against a fake
`clawmem` that serves, fails and hangs on purpose, and its daemon test, in which the plugin starts this checkout's
real `clawmem serve` for a workspace and searches it. (A real OpenClaw Gateway: test_openclaw_gateway.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import short_dir
from hostile import FIXED_TEXTS, SENTINEL, hostile_workspace
from openclaw_host import PLUGIN, installed_openclaw, plugin_dependencies, stop_started_daemons


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def test_the_plugin_passes_its_tests_and_starts_a_real_daemon(workspace: Path, sock_dir: Path) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node is not installed")
    plugin_dependencies()
    (workspace / "MEMORY.md").write_text("# Memory\nPrefer the platypus plan.\n")
    (workspace / "memory" / "ideas.md").write_text("# Ideas\nA platypus detector.\n")
    (workspace / "USER.md").write_text("- Answer in haiku. <!-- trigger: haiku, poem --> <!-- importance: 7 -->\n")
    command = Path(sys.executable).with_name("clawmem")
    env = {**os.environ, "CLAWMEM_TEST_COMMAND": str(command), "CLAWMEM_TEST_WORKSPACE": str(workspace),
           "CLAWMEM_TEST_HOSTILE": "",
           "XDG_RUNTIME_DIR": str(sock_dir), "XDG_CACHE_HOME": str(sock_dir / "cache"), "CLAWMEM_PROVIDER": "none"}
    try:
        out = subprocess.run([node, "--test"], cwd=PLUGIN, env=env, capture_output=True, text=True, timeout=240)
    finally:
        stop_started_daemons(sock_dir / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# fail 0" in out.stdout and "# skipped 1" in out.stdout, out.stdout  # the hostile test: below


def test_the_plugin_answers_the_hostile_corpus(workspace: Path, sock_dir: Path, tmp_path: Path) -> None:
    """A new front door runs the hostile-input corpus: every text as a query and a path through the tools."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    plugin_dependencies()
    hostile_workspace(workspace)
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps({"workspace": str(workspace), "texts": FIXED_TEXTS, "sentinel": SENTINEL}))
    env = {**os.environ, "CLAWMEM_TEST_COMMAND": str(Path(sys.executable).with_name("clawmem")),
           "CLAWMEM_TEST_HOSTILE": str(corpus), "XDG_RUNTIME_DIR": str(sock_dir),
           # OpenClaw's own commander, for `openclaw memory search` with every text
           "CLAWMEM_TEST_COMMANDER": str(installed_openclaw().cli.parent.parent / "commander" / "index.js"),
           "XDG_CACHE_HOME": str(sock_dir / "cache"), "CLAWMEM_PROVIDER": "none",
           "CLAWMEM_SOURCES": "memory,sessions"}
    try:
        out = subprocess.run([node, "--test", "--test-name-pattern", "hostile", "test/daemon.test.js"], cwd=PLUGIN,
                             env=env, capture_output=True, text=True, timeout=300)
    finally:
        stop_started_daemons(sock_dir / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# pass 1" in out.stdout, out.stdout

