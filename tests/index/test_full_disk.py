"""A full disk under the index: a clear error and no traceback, and a daemon that serves what is indexed.

The disk is a small tmpfs mounted in a mount namespace of the test's own (`unshare -rm`: no privilege
needed, nothing seen outside it). This file is also the scenario run inside it: the test starts
`unshare -rm python tests/index/test_full_disk.py SCENARIO DIR`, which mounts, runs the real `clawmem`
commands and prints what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

CLAWMEM = [sys.executable, "-m", "clawmem_index"]
DEADLINE = 60.0  # seconds any one wait below may take before the scenario gives up


def _notes(workspace: Path, count: int) -> None:
    (workspace / "memory").mkdir(parents=True)
    for n in range(count):
        lines = [f"# note {n}"] + [" ".join(f"word{(n * 31 + i * 7 + j) % 5000}" for j in range(15))
                                   for i in range(30)]
        (workspace / "memory" / f"n{n}.md").write_text("\n".join(lines) + "\n")


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLAWMEM, *args], env=env, capture_output=True, text=True, timeout=DEADLINE)


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as out:
        block = b"\0" * 65536
        while True:
            try:
                out.write(block)
                out.flush()
            except OSError:
                return


def _poll(check: Any) -> Any:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    return None


def scenario(name: str, base: Path) -> dict[str, Any]:
    disk, workspace = base / "disk", base / "ws"
    disk.mkdir()
    size = "400k" if name == "index" else "24m"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
    env = {**os.environ, "XDG_CACHE_HOME": str(disk), "XDG_RUNTIME_DIR": str(disk / "run"), "CLAWMEM_PROVIDER": "none"}
    (disk / "run").mkdir()
    _notes(workspace, 300 if name == "index" else 40)
    where = ("--workspace", str(workspace))
    if name == "index":
        out = _run("index", *where, env=env)
        return {"index": [out.returncode, out.stderr]}
    first = _run("index", *where, env=env)
    _fill(disk)
    (workspace / "memory" / "new.md").write_text("# new\nthe zebra migration plan\n")
    daemon = subprocess.Popen([*CLAWMEM, "serve", *where], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        def daemon_status() -> dict[str, Any] | None:
            out = _run("status", "--json", *where, env=env)
            data = json.loads(out.stdout) if out.returncode == 0 else {}
            return data if data.get("daemon") and data.get("last_error") else None

        full = _poll(daemon_status)
        search = _run("search", "word17", "--mode", "bm25", "--json", *where, env=env)
        (disk / "filler").unlink()

        def caught_up() -> dict[str, Any] | None:
            out = _run("status", "--json", *where, env=env)
            data = json.loads(out.stdout) if out.returncode == 0 else {}
            return data if data.get("fresh") else None

        fresh = _poll(caught_up)
        zebra = _run("search", "zebra", "--mode", "bm25", "--json", *where, env=env)
    finally:
        daemon.terminate()
        _, err = daemon.communicate(timeout=DEADLINE)
    return {"first": first.returncode, "full": full, "search": [search.returncode, search.stdout],
            "fresh": fresh, "zebra": [zebra.returncode, zebra.stdout], "daemon": [daemon.returncode, err]}


def _in_namespace(name: str, tmp_path: Path) -> dict[str, Any]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: no private tmpfs to fill")
    base = Path(tempfile.mkdtemp(prefix="cm-disk-", dir="/tmp"))  # short: the daemon's socket lives under it
    try:
        out = subprocess.run(["unshare", "-rm", sys.executable, __file__, name, str(base)], capture_output=True,
                             text=True, timeout=4 * DEADLINE, cwd=Path(__file__).parents[2])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_index_on_a_full_disk_exits_with_one_line_saying_so(tmp_path: Path) -> None:
    code, stderr = _in_namespace("index", tmp_path)["index"]
    assert code == 3 and "Traceback" not in stderr, stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith("clawmem: error: the disk holding the index") and "is full" in line
    assert "free some space" in line


def test_a_daemon_started_on_a_full_disk_serves_reads_says_why_it_is_stale_and_catches_up(tmp_path: Path) -> None:
    seen = _in_namespace("serve", tmp_path)
    assert seen["first"] == 0
    assert seen["full"] is not None, seen["daemon"]
    assert seen["full"]["fresh"] is False and "is full" in seen["full"]["last_error"]
    code, answer = seen["search"]
    assert code == 0 and json.loads(answer)["results"]
    assert seen["fresh"] is not None, "the daemon did not catch up once space was freed"
    code, answer = seen["zebra"]
    assert code == 0 and [r["path"] for r in json.loads(answer)["results"]] == ["memory/new.md"]
    code, stderr = seen["daemon"]
    assert "Traceback" not in stderr, stderr


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1], Path(sys.argv[2]))))
