"""OpenClaw's memory answered by clawmem, end to end: a real OpenClaw Gateway (Node 24, openclaw from npm) on
loopback with token auth, the memory-clawmem plugin in the memory slot, OpenClaw's own memory-core denied, and
clawmem daemons serving each agent's workspace. Everything goes through the Gateway's public surfaces: the tools
endpoint (/tools/invoke) and the `memory.search` RPC."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_helpers import RawClient, short_dir
from hostile import FIXED_TEXTS
from openclaw_host import PLUGIN, installed_openclaw, plugin_dependencies, running_gateway, stop_started_daemons

from clawmem_index.config import Settings

# Each Gateway waits for its own readiness (up to 240 s) and npm for its installs: on a loaded machine one module's
# Gateways took longer together than pytest's per-test 300 s, though each step was within its own bound.
pytestmark = pytest.mark.timeout(1800)

CLAWMEM = Path(sys.executable).with_name("clawmem")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def eventually(probe: Callable[[], object], what: str, timeout: float = 60) -> object:
    """Ask until `probe` gives something truthy (a deadline poll: the index catches up on a file event)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def paths(details: dict) -> list[str]:
    return [hit["path"] for hit in details["results"]]


def served_workspace(socket_path: Path) -> str | None:
    """The workspace the daemon on `socket_path` serves (None: none answers there)."""
    try:
        with RawClient(socket_path, timeout=5) as raw:
            return raw.call("status")["result"]["workspace"]
    except OSError:
        return None


def test_openclaw_answers_memory_from_clawmem(tmp_path: Path, sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    openclaw = installed_openclaw()
    plugin_dependencies()
    alpha, beta, broken = tmp_path / "alpha", tmp_path / "beta", tmp_path / "broken"
    for ws in (alpha, beta, broken):
        (ws / "memory").mkdir(parents=True)
    (alpha / "MEMORY.md").write_text("# Memory\n\nThe team prefers the platypus plan.\n")
    (beta / "memory" / "2026-11-20.md").write_text("# 2026-11-20\n\nThe zebra migration is beta's secret.\n")
    (broken / "clawmem.toml").write_text('[search]\nmode = "telepathy"\n')
    env = {"XDG_RUNTIME_DIR": str(sock_dir), "XDG_CACHE_HOME": str(sock_dir / "cache"), "CLAWMEM_PROVIDER": "none"}
    # alpha's daemon runs before the Gateway (as under systemd); beta's and broken's are the plugin's to start.
    daemon = subprocess.Popen([str(CLAWMEM), "serve", "--workspace", str(alpha)], env={**os.environ, **env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = {
        "agents": {"entries": {"alpha": {"workspace": str(alpha)}, "beta": {"workspace": str(beta)},
                               "broken": {"workspace": str(broken)}}},
        "plugins": {
            "load": {"paths": [str(PLUGIN)]},
            "slots": {"memory": "memory-clawmem"},
            "deny": ["memory-core"],
            "entries": {"memory-clawmem": {"enabled": True, "config": {"command": str(CLAWMEM)}}},
        },
    }
    try:
        with running_gateway(openclaw, tmp_path / "openclaw", config, env) as gateway:
            # The Gateway's start reached alpha's daemon and started beta's: beta is indexed before its first search.
            monkeypatch.setenv("XDG_RUNTIME_DIR", str(sock_dir))
            beta_socket = dataclasses.replace(Settings(), workspace=beta.resolve()).socket_path
            eventually(lambda: served_workspace(beta_socket) == str(beta.resolve()), "beta's daemon, from the start")
            # A note written after the daemon started, found through a stemmed query, and read back.
            (alpha / "memory" / "2026-11-28.md").write_text("# 2026-11-28\n\nWe counted the otters at the lake.\n")
            found = eventually(lambda: (d := gateway.details("memory_search", {"query": "otter counting"}, "alpha"))
                               ["results"] and d, "the new note through memory_search")
            assert paths(found)[0] == "memory/2026-11-28.md"
            assert found["debug"]["backend"] == "clawmem" and found["debug"]["agentId"] == "alpha"
            assert found["results"][0]["citation"] == "memory/2026-11-28.md#L1-L3"
            read = gateway.details("memory_get", {"path": "memory/2026-11-28.md", "from": 3, "lines": 1}, "alpha")
            assert (read["status"], read["text"]) == ("ok", "We counted the otters at the lake.")
            assert gateway.details("memory_get", {"path": "memory/none.md"}, "alpha")["status"] == "not_found"
            refused = gateway.details("memory_get", {"path": "../beta/memory/2026-11-20.md"}, "alpha")
            assert refused["status"] == "error" and "refused" in refused["error"]

            # OpenClaw's own RPC answers from clawmem too (memory-core is denied: nothing else could).
            rpc = gateway.call("memory.search", {"query": "platypus plans", "agentId": "alpha"})
            assert [hit["path"] for hit in rpc["results"]] == ["MEMORY.md"]
            # ... and so does its memory doctor, from the status clawmem's daemon gave.
            doctor = gateway.call("doctor.memory.status", {"agentId": "alpha"})
            assert doctor["provider"] == "none" and "keyword search only" in doctor["embedding"]["error"]

            # The hostile corpus through the Gateway's JSON: each a result or a refusal, and the Gateway goes on.
            for name, text in FIXED_TEXTS.items():
                for tool, args in (("memory_search", {"query": text}), ("memory_get", {"path": text})):
                    status, body = gateway.invoke(tool, args, "alpha")
                    assert status in (200, 400) and "ok" in body, (name, tool, status, body)
                    if status == 200:
                        assert body["result"]["details"]["debug"]["backend"] == "clawmem", (name, tool)

            # Each agent sees only its own workspace.
            assert paths(gateway.details("memory_search", {"query": "zebra migrations"}, "beta")) == [
                "memory/2026-11-20.md"]
            assert paths(gateway.details("memory_search", {"query": "zebra migrations"}, "alpha")) == []
            assert paths(gateway.details("memory_search", {"query": "otters"}, "beta")) == []

            # A workspace whose clawmem cannot start: a tool result carrying clawmem's own message, at once.
            began = time.monotonic()
            failed = gateway.details("memory_search", {"query": "anything"}, "broken")
            assert failed["unavailable"] is True and failed["results"] == []
            assert "invalid setting 'search.mode'" in failed["error"] and "stopped at once" in failed["error"]
            assert time.monotonic() - began < 20

            # alpha's daemon stops: the next search starts another, and the Gateway answers throughout.
            daemon.terminate()
            daemon.wait(timeout=30)
            again = gateway.details("memory_search", {"query": "otter counting"}, "alpha")
            assert paths(again)[0] == "memory/2026-11-28.md"
            assert gateway.ready()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        stop_started_daemons(sock_dir / "cache")
