"""The rules the code claims, checked where the README's test command runs them: lint (ruff: pyflakes,
pycodestyle, bugbear and a complexity ceiling, as pyproject.toml selects), types (mypy --strict on the
whole package), modules of at most MAX_LINES lines, and an error tree that names every error.
Each check is also shown to refuse what it forbids, so a setting dropped from pyproject.toml fails here."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import clawmem_index.errors as errors

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # ruff and mypy come with the test extra
MAX_LINES = 500
LINTED = ("clawmem_index", "tests", "bench", "scripts")


def run(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_code_passes_the_linter() -> None:
    out = run("ruff", "check", "--no-cache", *LINTED)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_linter_refuses_what_the_rules_forbid(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(13))
    (tmp_path / "bad.py").write_text(
        "import os\n\n\n"  # F401: imported and unused
        f"def long() -> str:\n    return '{'x' * 130}'\n\n\n"  # E501: past 120 characters
        "def mutable(x: list = []) -> list:\n    return x\n\n\n"  # B006: a shared default
        f"def branchy(x: int) -> int:\n{branches}\n    return -1\n")  # C901: past the complexity ceiling
    out = run("ruff", "check", "--no-cache", "--output-format", "concise", "bad.py", cwd=tmp_path)
    assert out.returncode == 1
    for code in ("F401", "E501", "B006", "C901"):
        assert code in out.stdout, (code, out.stdout)


def test_the_whole_package_passes_strict_mypy(tmp_path: Path) -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert settings["files"] == ["clawmem_index"] and settings["strict"] is True
    out = run("mypy", "--cache-dir", str(tmp_path / "cache"))  # the files and flags of pyproject.toml's [tool.mypy]
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_is_strict_there(tmp_path: Path) -> None:
    (tmp_path / "loose.py").write_text("def untyped(x):\n    return x\n")
    out = run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
              str(tmp_path / "loose.py"))
    assert out.returncode == 1 and "no-untyped-def" in out.stdout, out.stdout + out.stderr


def test_both_stores_are_the_interface_to_mypy(tmp_path: Path) -> None:
    """The engine holds stores as `IndexStore`: each store must be one as mypy reads it (an attribute of another
    type, a method of other parameters fails here, not only at run time)."""
    (tmp_path / "stores.py").write_text(
        "from clawmem_index.index.interface import IndexStore\n"
        "from clawmem_index.index.pg.store import PgStore\n"
        "from clawmem_index.index.store import Store\n\n\n"
        "def held(sqlite: Store, shared: PgStore) -> list[IndexStore]:\n"
        "    return [sqlite, shared]\n")  # and each backend is a Backend of its own stores: backends.py is typed
    out = run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
              str(tmp_path / "stores.py"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_module_is_past_the_size_a_reader_takes_in() -> None:
    sizes = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
             for path in sorted((ROOT / "clawmem_index").rglob("*.py"))}
    assert sizes and {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_the_error_tree_names_every_error() -> None:
    """`errors.__all__` is the list a program catching clawmem's errors reads, and the module's tree the map."""
    defined = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__}
    assert defined == set(errors.__all__)
    assert errors.__doc__ is not None
    assert [name for name in sorted(defined) if not re.search(rf"\b{name}\b", errors.__doc__)] == []
