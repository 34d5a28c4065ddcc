"""The package's layers (pyproject.toml's import-linter contract) hold, and an import upwards breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).parent / "lint-imports"  # import-linter's command, in the test extra
    return subprocess.run([str(command), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_layers_hold() -> None:
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_an_import_from_a_higher_layer_breaks_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "clawmem_index", tmp_path / "clawmem_index", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    tokens = tmp_path / "clawmem_index" / "text" / "tokens.py"
    tokens.write_text(tokens.read_text()
                      + "\n\ndef _upwards() -> None:\n    from clawmem_index.engine import core  # noqa\n")
    out = lint_imports(tmp_path)
    assert out.returncode == 1 and "BROKEN" in out.stdout, out.stdout + out.stderr
    assert "clawmem_index.text.tokens -> clawmem_index.engine.core" in out.stdout
