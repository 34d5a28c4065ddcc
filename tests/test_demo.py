"""The README's first command, `bash scripts/demo.sh`, as a user runs it (the set-up is the suite's own .venv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import stop_process, wait_until

ROOT = Path(__file__).resolve().parents[1]


def _demo(workspace: Path, tmp_path: Path) -> subprocess.Popen[str]:
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("runs inside the .venv that scripts/setup.sh made")
    # setup.sh finds its last run complete and stops at once: nothing is installed, no index asked
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}
    return subprocess.Popen(["bash", str(ROOT / "scripts" / "demo.sh"), str(workspace)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _lines_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # ends when the demo exits: a marker never printed fails below
        seen.append(line.rstrip("\n"))
        if marker in line:
            break
    return seen


def test_the_demo_shows_a_hybrid_answer_to_the_command_it_echoes_then_serves(tmp_path: Path) -> None:
    workspace = tmp_path / "demo"
    demo = _demo(workspace, tmp_path)
    try:
        out = _lines_until(demo, "Serving")
        assert out[-1] == f"Serving {workspace}. In another terminal:", out
        command = next(line for line in out if line.startswith("$ "))
        assert command == f'$ .venv/bin/clawmem search --workspace {workspace} "which staging server do deploys use"'
        assert any(line.startswith("MEMORY.md:") for line in out[out.index(command):])
    finally:
        stop_process(demo)  # type: ignore[arg-type]
        _, err = demo.communicate(timeout=30)
    assert "keyword results only" not in err and "keyword search only" not in err, err


def test_a_demo_beside_a_daemon_already_serving_says_so_instead_of_a_serving_banner(tmp_path: Path) -> None:
    workspace = tmp_path / "demo"
    first = _demo(workspace, tmp_path)
    try:
        _lines_until(first, "Serving")
        status = [sys.executable, "-m", "clawmem_index", "status", "--workspace", str(workspace), "--json"]
        wait_until(lambda: '"daemon"' in subprocess.run(status, capture_output=True, text=True).stdout,
                   timeout=60, message="the first demo's daemon answering")
        second = _demo(workspace, tmp_path)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0, err
        assert "already serves" in out and "Serving" not in out, out
    finally:
        stop_process(first)  # type: ignore[arg-type]
        first.communicate(timeout=30)
