"""docs/postgres-setup.md, followed literally: each `sh` block, in order, against a real PostgreSQL of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pg_server

DOC = Path(__file__).resolve().parents[1] / "docs" / "postgres-setup.md"


def blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", DOC.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_the_how_to_runs_as_written_and_its_roles_get_what_it_says(tmp_path: Path) -> None:
    assert len(blocks()) == 5
    server = pg_server.start()
    try:
        home = tmp_path / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "CLAWMEM_"))}
        env.update(PATH=f"{server.bin}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   PGHOST=str(server.sockets), PGPORT=str(server.port), HOME=str(home))
        for number, block in enumerate(blocks(), start=1):
            out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env, capture_output=True, text=True,
                                 timeout=300)
            assert out.returncode == 0, f"step {number} failed:\n{block}\n{out.stdout}\n{out.stderr}"
            if number in (3, 4):  # the agent's and the reader's searches found the note
                assert "MEMORY.md:" in out.stdout and "failover runbook" in out.stdout, out.stdout
    finally:
        server.close()


def test_grant_without_a_shared_index_url_says_what_it_needs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
    out = subprocess.run([sys.executable, "-m", "clawmem_index", "grant", "agent", "alpha"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (1, "clawmem: error: grant needs the shared index's postgresql:// URL:"
                                               " --url or CLAWMEM_INDEX_URL\n")
