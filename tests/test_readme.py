"""The examples of the README and of the user guide under docs/, run as written, so they cannot rot.

Every fenced block tagged `sh`, `python` or `js` is an example a user will copy: each runs in a
shell as that user would have it after the README's set-up (`clawmem` on PATH, a home with the
starter workspace in `~/agent` indexed and its daemon serving on the default socket), with the
workspace as the current directory. Indented blocks are synopses and commands that change the
system (installing, systemd); fenced `toml` blocks are configuration, loaded by the real loader.
Keyword-only (`CLAWMEM_PROVIDER=none`), so no example waits for a model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from daemon_helpers import short_dir, stop_process, wait_listening

from clawmem_index.config import load_settings

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"
# The pages a user reads to use clawmem (docs/postgres-setup.md runs against a server of its own:
# tests/test_postgres_setup.py; the benchmark pages quote commands for a benchmark machine).
GUIDE = [README, *(DOCS / f"{name}.md" for name in (
    "install", "cli", "python-client", "mcp", "openclaw", "indexing", "embeddings", "search", "daemon",
    "socket-api", "postgres", "settings", "schema", "architecture"))]
RUNNERS = {"sh": ["bash", "-euo", "pipefail", "-c"], "python": [sys.executable, "-c"],
           "js": ["node", "--input-type=module", "-e"]}
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
EXAMPLE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Example:
    language: str
    code: str
    line: int
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.language}@L{self.line}"


def examples(*languages: str) -> list[Example]:
    found = []
    for page in GUIDE:
        text = page.read_text(encoding="utf-8")
        name = str(page.relative_to(README.parent))
        found += [Example(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, name)
                  for m in FENCE.finditer(text) if m.group(1) in languages]
    return found


@dataclass(frozen=True)
class Home:
    env: dict[str, str]
    workspace: Path


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    """A user's home after the README's set-up, with the starter workspace served by its daemon."""
    root = tmp_path_factory.mktemp("readme")
    runtime = next(short_dir())
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_") and k not in ("VIRTUAL_ENV",)}
    env.update(HOME=str(root / "home"), XDG_CACHE_HOME=str(root / "home" / ".cache"),
               XDG_CONFIG_HOME=str(root / "home" / ".config"), XDG_RUNTIME_DIR=str(runtime),
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", CLAWMEM_PROVIDER="none", NO_COLOR="1")
    workspace = root / "home" / "agent"
    subprocess.run(["clawmem", "init", str(workspace)], env=env, check=True, capture_output=True)
    subprocess.run(["clawmem", "index"], env=env, cwd=workspace, check=True, capture_output=True)
    status = subprocess.run(["clawmem", "status", "--json"], env=env, cwd=workspace, check=True, capture_output=True)
    socket_path = Path(json.loads(status.stdout)["socket"])
    log = (root / "serve.log").open("wb")
    daemon = subprocess.Popen(["clawmem", "serve"], env=env, cwd=workspace, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_listening(socket_path, daemon)
        yield Home(env, workspace)
    finally:
        stop_process(daemon)
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)


def run(example: Example, home: Home) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNNERS[example.language], example.code], env=home.env, cwd=home.workspace,
                          capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT)


@pytest.mark.parametrize("example", examples("sh", "python", "js"), ids=str)
def test_the_example_runs_as_written(example: Example, home: Home) -> None:
    tools = {"js": "node"}.get(example.language), *re.findall(r"\bsocat\b", example.code)
    missing = [tool for tool in tools if tool is not None and shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)} (optional for users; CI installs them)")
    done = run(example, home)
    assert done.returncode == 0, f"{example.page} line {example.line} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{example.page} line {example.line} printed nothing"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("example", examples("toml"), ids=str)
def test_the_configuration_example_loads(example: Example, tmp_path: Path) -> None:
    tomllib.loads(example.code)
    (tmp_path / "clawmem.toml").write_text(example.code, encoding="utf-8")
    load_settings(workspace=tmp_path, environ={})


def test_the_guide_has_examples_in_each_language() -> None:
    found = {e.language for e in examples("sh", "python", "js", "toml")}
    assert found == {"sh", "python", "js", "toml"}
    assert {e.language for e in examples("sh", "python") if e.page == "README.md"} == {"sh", "python"}, \
        "the README's first search, in the shell and in Python"


def test_a_failing_example_fails(home: Home) -> None:
    """The harness itself: an example that errors must not pass for printing something."""
    broken = Example("sh", "clawmem get ../outside.md\n", 0)
    assert run(broken, home).returncode != 0


def test_install_lines_name_the_projects_own_distribution() -> None:
    """`clawmem` on the package index is another project: every install line must say ours (pyproject's name)."""
    import tomllib

    from clawmem_index import DISTRIBUTION

    root = README.parent
    name = tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"]
    assert DISTRIBUTION == name != "clawmem"
    docs = [README, *sorted((root / "docs").glob("*.md")), *sorted((root / "scripts").glob("*.sh"))]
    named = []
    for doc in docs:
        for line in doc.read_text().splitlines():
            for found in re.finditer(r"pip install\s+([^`#\n]*)", line):
                for word in found.group(1).split():
                    package = word.strip("'\"")
                    if re.match(r"clawmem\b", package):
                        named.append(package)
                        assert re.fullmatch(rf"{re.escape(name)}(\[[\w,]+\])?", package), (doc.name, line)
    assert f"{name}" in named and any(p.startswith(f"{name}[") for p in named)


def test_every_socket_error_code_is_in_the_socket_api_page() -> None:
    """A client meets these: each must be explained where the socket API is."""
    import inspect

    from clawmem_index import errors
    from clawmem_index.service import replies

    codes = {value for name, value in vars(replies).items() if name.isupper() and isinstance(value, int)
             and -32768 <= value <= -32000}
    codes |= {cls.rpc_code for cls in vars(errors).values() if inspect.isclass(cls) and hasattr(cls, "rpc_code")}
    text = (DOCS / "socket-api.md").read_text()
    missing = sorted(code for code in codes if str(code) not in text)
    assert not missing, f"error codes not in docs/socket-api.md: {missing}"
