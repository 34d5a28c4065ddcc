"""The Node client type-checked: its JavaScript against its JSDoc (TypeScript's checkJs) and its declarations
(index.d.ts) compiled beside it, with TypeScript from the npm registry, installed once under .cache as the
plugin's modules are. The declarations' names are held to the code's exports by the client's own test
(test/types.test.js); this holds the types."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "integrations" / "clawmem-client"
TOOLS = ROOT / ".cache" / "typescript"
PACKAGES = ("typescript@5", "@types/node@20")


def tsc() -> Path:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: the Node client's type check needs it (CI installs Node)")
    TOOLS.mkdir(parents=True, exist_ok=True)
    with open(TOOLS.parent / "typescript.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install, whichever worker comes first
        binary = TOOLS / "node_modules" / ".bin" / "tsc"
        if not (binary.exists() and (TOOLS / "node_modules" / "@types" / "node" / "package.json").exists()):
            out = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix",
                                  str(TOOLS), *PACKAGES], capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"npm install of {' '.join(PACKAGES)} failed: {out.stderr[-2000:]}")
    return binary


def check(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tsc()), "--noEmit", "--allowJs", "--checkJs", "--target", "es2022", "--module",
                           "nodenext", "--moduleResolution", "nodenext", "--typeRoots",
                           str(TOOLS / "node_modules" / "@types"), "--types", "node", "index.js", "index.d.ts"],
                          cwd=folder, capture_output=True, text=True, timeout=120)


def test_the_node_client_type_checks() -> None:
    out = check(PACKAGE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_type_check_refuses_a_call_its_docs_forbid(tmp_path: Path) -> None:
    for name in ("index.js", "index.d.ts", "package.json"):
        shutil.copy(PACKAGE / name, tmp_path)
    script = tmp_path / "index.js"
    script.write_text(script.read_text() + "\nnew ClawmemClient().get(42);\n")  # a path is a string
    out = check(tmp_path)
    assert out.returncode != 0 and "TS2345" in out.stdout, out.stdout + out.stderr
