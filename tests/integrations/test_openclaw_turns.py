"""Agent turns through a real OpenClaw Gateway, with OpenClaw's own memory-core and with memory-clawmem installed as the
README says, against a fake chat model on 127.0.0.1 that records every request it is sent: the same memory reaches the
model either way.

A user of memory-core (a workspace with MEMORY.md, USER.md and a daily note, Active Memory on, the default plugin set)
runs the README's install lines as written in a copy of this checkout, then talks to the agent. Each turn is a normal
agent turn (POST /v1/chat/completions); the model calls memory_search through OpenClaw's Tool Search bridge. Asserted
for both, and compared: MEMORY.md and USER.md in the system prompt, the Memory Recall section, the trigger-matched
USER.md entry injected before the message, the search's hits handed back to the model (and whose they are), the
pre-compaction flush offered and its note found by the next search, and `openclaw memory status | search`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import short_dir
from fake_chat import FakeModel, content_text, system_text, text, tool_call
from openclaw_host import (
    ROOT,
    OpenClaw,
    free_port,
    gateway_section,
    installed_openclaw,
    started_gateway,
    stop_started_daemons,
)

# Each Gateway waits for its own readiness (up to 240 s) and npm for its installs: on a loaded machine one module's
# Gateways took longer together than pytest's per-test 300 s, though each step was within its own bound.
pytestmark = pytest.mark.timeout(1800)

README = ROOT / "README.md"
MEMORY_MD = """# Memory

- The project codename is Bluefin. <!-- importance: 7 -->
- Keep the gateway on loopback. <!-- trigger: gateway setup, network safety --> <!-- importance: 9 -->
"""
USER_MD = """# User

- Always answer in haiku. <!-- trigger: poem, verse --> <!-- importance: 8 -->
"""
DAILY = ("2026-11-30.md",
         "# 2026-11-30\n\n- Discussed the lighthouse restoration budget: 42k euros, approved by Marta.\n")
FLUSH_MARK = "Pre-compaction memory flush"
FLUSHED = "FLUSHED: the user keeps a lighthouse logbook."


def readme_install_lines() -> str:
    """The README's OpenClaw install block, exactly as a user copies it."""
    readme = README.read_text(encoding="utf-8")
    after = readme[readme.index("<!-- openclaw-install"):]
    found = re.search(r"```bash\n(.*?)```", after, re.DOTALL)
    assert found, "the README's OpenClaw section lost its install block"
    return found.group(1)


def fresh_clone(where: Path) -> Path:
    """What a fresh clone holds for the install lines (the plugin with no node_modules), with this checkout's .venv."""
    clone = where / "clawmem"
    clone.mkdir(parents=True)
    shutil.copytree(ROOT / "integrations", clone / "integrations",
                    ignore=shutil.ignore_patterns("node_modules", "*.tgz"))
    (clone / ".venv").symlink_to(ROOT / ".venv")  # set up by `bash scripts/setup.sh`, as the README says first
    return clone


def injected_block(message: str) -> str:
    """The context Active Memory put before the user's words (OpenClaw dates the message: that part is left out)."""
    found = re.search(r"Context:\n(<active_memory_plugin>.*?</active_memory_plugin>)", message, re.DOTALL)
    return found.group(1) if found else ""


def flush_request(body: dict[str, Any]) -> bool:
    return FLUSH_MARK in system_text(body) or any(
        FLUSH_MARK in content_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "user")


def tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("function", {}).get("name") for t in body.get("tools") or []}


def section(system: str, heading: str) -> str:
    start = system.find(heading)
    if start < 0:
        return ""
    end = system.find("\n## ", start + len(heading))
    return system[start:end if end > 0 else None]


@dataclass
class Turns:
    """What one backend's agent turns showed."""

    warm_backend: str | None = None
    system: str = ""
    user_message: str = ""
    tool_result: str = ""
    flush: dict[str, Any] | None = None
    flushed_found: list[str] = field(default_factory=list)
    status: Any = None
    search: Any = None
    indexed: str = ""
    log: str = ""


def user_config(fake: FakeModel, workspace: Path, port: int, token: str) -> dict[str, Any]:
    """The ~/.openclaw/openclaw.json of someone who uses memory-core: a model, a workspace, Active Memory on for the
    agent, and a flush after the first reply (so the test need not fill a context window)."""
    return {
        "gateway": gateway_section(port, token),
        "models": {"providers": {"fake": {"baseUrl": fake.base_url, "apiKey": "x", "api": "openai-completions",
                                          "models": [{"id": "fake-model", "name": "Fake model", "contextWindow": 128000,
                                                      "maxTokens": 4096, "input": ["text"], "reasoning": False}]}}},
        "agents": {"defaults": {"model": {"primary": "fake/fake-model"}, "workspace": str(workspace),
                                "compaction": {"memoryFlush": {"forceFlushTranscriptBytes": 1}}}},
        "memory": {"search": {"provider": "none", "rememberAcrossConversations": False, "sources": ["memory"]}},
        "plugins": {"entries": {"active-memory": {"enabled": True, "config": {"enabled": True, "agents": ["main"],
                                                                             "mode": "off", "logging": True}}}},
    }


def eventually(probe: Any, what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.25)


def openclaw_cli(openclaw: OpenClaw, env: dict[str, str], *args: str, cwd: Path | None = None) -> Any:
    out = subprocess.run([str(openclaw.cli), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"openclaw {' '.join(args)}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return json.loads(out.stdout[out.stdout.index("[" if args[1] == "status" else "{"):])


def run_turns(openclaw: OpenClaw, root: Path, *, install: bool, lines: slice = slice(None),
              turns: bool = True) -> Turns:
    """A memory-core user's home, clawmem installed by the README's lines if `install`, then the turns."""
    home, workspace = root / "home", root / "home" / "agent"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(MEMORY_MD)
    (workspace / "USER.md").write_text(USER_MD)
    (workspace / "memory" / DAILY[0]).write_text(DAILY[1])
    runtime = next(short_dir())
    fake = FakeModel().start()
    port, token = free_port(), secrets.token_hex(16)
    (home / ".openclaw").mkdir(parents=True)
    (home / ".openclaw" / "openclaw.json").write_text(json.dumps(user_config(fake, workspace, port, token), indent=2))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CLAWMEM_", "OPENCLAW_", "XDG_"))}
    env = openclaw.env({**base, "HOME": str(home), "TMPDIR": str(home), "XDG_RUNTIME_DIR": str(runtime),
                        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
                        "CLAWMEM_PROVIDER": "none"})
    env["PATH"] = f"{openclaw.cli.parent}{os.pathsep}{env['PATH']}"  # `openclaw`, as a global npm install puts it
    seen = Turns()
    try:
        if install:
            clone = fresh_clone(root)
            block = "\n".join(readme_install_lines().splitlines()[lines])
            script = "set -euo pipefail\n" + block + '\necho "PATH=$PATH"\n'
            done = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, \
                f"the README's install lines failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            env["PATH"] = done.stdout.rsplit("PATH=", 1)[1].strip()  # the README's export: clawmem on the PATH
        # The day's note the flush writes to is named in the flush's own prompt.
        def flush_write(body: dict[str, Any]) -> dict[str, Any]:
            prompt = "\n".join(content_text(m.get("content")) for m in body.get("messages") or [])
            target = re.search(r"memory/\d{4}-\d{2}-\d{2}\.md", prompt)
            assert target, prompt[-500:]
            return tool_call("write", {"path": target.group(0), "content": f"- {FLUSHED}\n"})

        last_is_tool = lambda body: (body.get("messages") or [{}])[-1].get("role") == "tool"  # noqa: E731
        fake.rule(lambda b: flush_request(b) and not last_is_tool(b), flush_write)
        fake.rule(lambda b: flush_request(b) and last_is_tool(b), text("NO_REPLY"))
        with started_gateway(openclaw, env, port, token, home / "gateway.log") as gateway:
            last: list[Any] = []

            def warm() -> dict[str, Any] | None:
                status, body = gateway.invoke("memory_search", {"query": "lighthouse budget"}, "main")
                last[:] = [status, body]
                details = body.get("result", {}).get("details", {}) if status == 200 else {}
                return details if details.get("results") and not details.get("stale") else None

            # The index is built (the trigger lane has 1.5 s and would miss a cold one, with either backend).
            try:
                seen.warm_backend = (eventually(warm, "a search answered from a whole index")
                                     .get("debug", {}).get("backend"))
            except AssertionError as exc:
                raise AssertionError(f"{exc}: last {json.dumps(last)[:1500]};"
                                     f" log {gateway.log.read_text()[-3000:]}") from None
            if not turns:
                seen.log = gateway.log.read_text(errors="replace")
                return seen
            fake.script(tool_call("tool_call", {"id": "memory_search",
                                                "args": {"query": "lighthouse restoration budget"}}),
                        text("Forty-two thousand\nfor the lighthouse, Marta said\nyes, in November."))
            before = len(fake.requests)
            gateway.chat("Please write a poem about the lighthouse budget we agreed.", user="parity")
            turn = fake.requests[before:]
            seen.system = system_text(turn[0])
            asked = [content_text(m["content"]) for m in turn[0]["messages"] if m.get("role") == "user"]
            seen.user_message = next((m for m in asked if "lighthouse budget we agreed" in m), "\n---\n".join(asked))
            seen.tool_result = "\n".join(content_text(m.get("content")) for body in turn for m in body["messages"]
                                         if m.get("role") == "tool")
            # The flush runs after the reply (post-turn maintenance): its request, and the note it wrote, found.
            eventually(lambda: any(flush_request(b) for b in fake.requests), "the pre-compaction flush", 90)
            seen.flush = next(b for b in fake.requests if flush_request(b))

            def flushed() -> list[str]:
                status, body = gateway.invoke("memory_search", {"query": "lighthouse logbook"}, "main")
                hits = body.get("result", {}).get("details", {}).get("results", []) if status == 200 else []
                return [h["path"] for h in hits if "lighthouse logbook" in h.get("snippet", "")]

            seen.flushed_found = eventually(flushed, "the flushed note through memory_search", 90)
            seen.status = openclaw_cli(openclaw, env, "memory", "status", "--json")
            seen.search = openclaw_cli(openclaw, env, "memory", "search", "lighthouse budget", "--json")
            if install:  # memory-core's `memory index` prints its own report; clawmem's says what it indexed
                done = subprocess.run([str(openclaw.cli), "memory", "index", "--force"], env=env, capture_output=True,
                                      text=True, timeout=240)
                seen.indexed = done.stdout + done.stderr
        seen.log = (home / "gateway.log").read_text(errors="replace")
        return seen
    finally:
        fake.stop()
        stop_started_daemons(home / ".cache")
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def turns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Turns]:
    if shutil.which("npm") is None:
        pytest.fail("npm is not installed: the OpenClaw end-to-end tests need it (CI installs Node)")
    openclaw = installed_openclaw()
    return {"memory-core": run_turns(openclaw, tmp_path_factory.mktemp("core"), install=False),
            "memory-clawmem": run_turns(openclaw, tmp_path_factory.mktemp("clawmem"), install=True)}


@pytest.mark.parametrize("backend", ["memory-core", "memory-clawmem"])
def test_memory_md_and_user_md_are_in_every_turns_system_prompt(turns: dict[str, Turns], backend: str) -> None:
    system = turns[backend].system
    assert "## Workspace Files (injected)" in system
    assert re.search(r"## \S+/MEMORY\.md\n+# Memory\n+- The project codename is Bluefin\.", system), system[-3000:]
    assert re.search(r"## \S+/USER\.md\n+# User\n+- Always answer in haiku\.", system)
    assert "excluding automatic memory context" not in turns[backend].log


@pytest.mark.parametrize("backend", ["memory-core", "memory-clawmem"])
def test_the_recall_section_tells_the_model_to_search_memory(turns: dict[str, Turns], backend: str) -> None:
    recall = section(turns[backend].system, "## Memory Recall")
    assert "run memory_search; for memory-file hits, use memory_get" in recall, recall


@pytest.mark.parametrize("backend", ["memory-core", "memory-clawmem"])
def test_a_trigger_matched_entry_is_put_before_the_message(turns: dict[str, Turns], backend: str) -> None:
    injected = injected_block(turns[backend].user_message)
    assert injected == ("<active_memory_plugin>\n- - Always answer in haiku. (Source: USER.md#L3)\n"
                        "</active_memory_plugin>"), \
        turns[backend].user_message[:500]
    assert "Please write a poem about the lighthouse budget we agreed." in turns[backend].user_message


@pytest.mark.parametrize("backend", ["memory-core", "memory-clawmem"])
def test_the_models_memory_search_is_answered_and_handed_back(turns: dict[str, Turns], backend: str) -> None:
    result = turns[backend].tool_result
    assert "memory/2026-11-30.md" in result and "42k euros" in result, result[:2000]
    expected = "clawmem" if backend == "memory-clawmem" else "builtin"
    assert turns[backend].warm_backend == expected  # memory-core installed and not denied: clawmem's tools answer
    assert f'"backend": "{expected}"' in result or f'"backend":"{expected}"' in result


@pytest.mark.parametrize("backend", ["memory-core", "memory-clawmem"])
def test_the_flush_is_offered_and_its_note_is_found_next(turns: dict[str, Turns], backend: str) -> None:
    flush = turns[backend].flush
    assert flush is not None and tool_names(flush) <= {"read", "write"} and "write" in tool_names(flush)
    assert re.search(r"Store durable memories only in memory/\d{4}-\d{2}-\d{2}\.md", system_text(flush)
                     + "\n".join(content_text(m.get("content")) for m in flush["messages"]))
    assert any(re.fullmatch(r"memory/\d{4}-\d{2}-\d{2}\.md", path) for path in turns[backend].flushed_found)


@pytest.mark.parametrize("backend", ["memory-core", "memory-clawmem"])
def test_openclaw_memory_status_and_search(turns: dict[str, Turns], backend: str) -> None:
    status, search = turns[backend].status, turns[backend].search
    assert status[0]["agentId"] == "main"
    assert status[0]["status"]["backend"] == ("clawmem" if backend == "memory-clawmem" else "builtin")
    assert search["results"][0]["path"] == "memory/2026-11-30.md"


def test_openclaw_memory_index_is_clawmems(turns: dict[str, Turns]) -> None:
    assert re.search(r"^main: \d+ files, \d+ chunks indexed \(", turns["memory-clawmem"].indexed, re.MULTILINE), \
        turns["memory-clawmem"].indexed[-1000:]


def test_without_the_readmes_last_line_memory_core_answers_and_the_plugin_says_so(
        tmp_path_factory: pytest.TempPathFactory, turns: dict[str, Turns]) -> None:
    """Why the README's last line is there: OpenClaw runs memory-core beside the slot's plugin as its dreaming engine,
    and a bundled plugin's tool of a name wins over an installed one's. The plugin warns, naming both remedies."""
    seen = run_turns(installed_openclaw(), tmp_path_factory.mktemp("shadowed"), install=True, lines=slice(0, -1),
                     turns=False)
    assert seen.warm_backend == "builtin"  # memory-core's memory_search answered
    assert "plugin tool name conflict (memory-clawmem): memory_search" in seen.log
    assert "memory-core runs beside memory-clawmem" in seen.log and "dreaming.enabled false" in seen.log


def test_both_backends_give_the_model_the_same_memory(turns: dict[str, Turns]) -> None:
    core, clawmem = turns["memory-core"], turns["memory-clawmem"]
    assert section(core.system, "## Memory Recall") == section(clawmem.system, "## Memory Recall")
    assert injected_block(core.user_message) == injected_block(clawmem.user_message)

    def flush_prompt(turns: Turns) -> str:
        assert turns.flush is not None
        asked = [content_text(m.get("content")) for m in turns.flush["messages"] if m.get("role") == "user"]
        prompt = next(m for m in asked if FLUSH_MARK in m)
        return re.sub(r"Current time: .*|Reference UTC: .*|^\[[^]]*\] ", "", prompt, flags=re.MULTILINE).strip()

    assert flush_prompt(core) == flush_prompt(clawmem)  # memory-core's flush, word for word
    assert "memory-core runs beside memory-clawmem" not in clawmem.log  # the README's configuration: no shadowing
