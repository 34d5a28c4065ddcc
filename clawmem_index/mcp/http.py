"""`clawmem mcp --http`: the MCP tools over Streamable HTTP on 127.0.0.1, for this user only.

Listening on loopback is not privacy: any local user can connect. So every request must carry the
server's bearer token (`Authorization: Bearer ...`), compared in constant time; without it the
answer is 401 and nothing of the memory is read. The token is generated on first use into a 0600
file in clawmem's 0700 config folder (beside the systemd EnvironmentFile), or read from
`--token-file`. The SDK's Host/Origin checks (DNS-rebinding protection) stay on.

Sessions are bounded so that a flood of `initialize` requests, or many clients, cannot exhaust
memory or lock the real client out: at most MAX_SESSIONS at once, each closed after
SESSION_IDLE_SECONDS without a request, and at the cap a new session ends the least recently used
one instead of being refused. A session's GET stream (one at most, the SDK's rule; every SDK client
holds one) does not count as use: it carries only keep-alives, so counting it would keep every
connected client's session forever and fill the cap for good. An ended session's id answers 404
"session not found ... initialize a new session", as the MCP spec asks. A request body over
MAX_BODY_BYTES is refused (413, by the SDK's own limit) as soon as it is seen to be.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clawmem_index.errors import TokenFileError

__all__ = ["MAX_BODY_BYTES", "MAX_SESSIONS", "MAX_TOKEN_CHARS", "MIN_TOKEN_CHARS", "SESSION_GONE",
           "SESSION_IDLE_SECONDS", "build_app", "default_token_path", "load_token"]

MAX_SESSIONS = 64  # sessions of one server at once; an agent host keeps one or two
SESSION_IDLE_SECONDS = 10 * 60.0  # a session without any request for this long is closed
MAX_BODY_BYTES = 1 << 20  # a tool call is a few hundred bytes
MIN_TOKEN_CHARS = 16  # a --token-file token; the generated one has 43
MAX_TOKEN_CHARS = 4096  # well inside what HTTP servers take as one header
_TOKEN_BYTES = 32


def default_token_path(environ: Mapping[str, str] = os.environ) -> Path:
    """$XDG_CONFIG_HOME/clawmem/mcp-token: clawmem's private config folder, where its EnvironmentFile lives."""
    config = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "clawmem" / "mcp-token"


def load_token(path: Path | None = None, *, environ: Mapping[str, str] = os.environ) -> tuple[str, Path, bool]:
    """(token, its file, whether it was just created); a file no client could use is a TokenFileError.

    A given `path` (`--token-file`) must be a regular file of this user's holding one token: 16 to
    MAX_TOKEN_CHARS visible ASCII characters (what an HTTP header can carry). The default file is
    created on first use (0600, in a 0700 folder), never rewritten afterwards.
    """
    if path is not None:
        token = _read_token(path)
        if token is None:
            raise TokenFileError(f"the MCP token file {path} does not exist: write one token of at least"
                                 f" {MIN_TOKEN_CHARS} characters into it (chmod 600), or leave out --token-file")
        return token, path, False
    path = default_token_path(environ)
    token = _read_token(path)
    if token is not None:
        return token, path, False
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another server made it a moment ago: use that one
        return load_token(path)
    except OSError as exc:
        raise TokenFileError(f"the MCP token file {path} cannot be created: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode("ascii"))
    finally:
        os.close(fd)
    return token, path, True


_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFDIR: "directory", stat.S_IFCHR: "device", stat.S_IFBLK: "device",
          stat.S_IFSOCK: "socket", stat.S_IFLNK: "symbolic link"}


def _read_token(path: Path) -> str | None:
    """The token in `path`, or None when nothing is there. Checked before it is opened, and opened
    non-blocking, so that a FIFO or a device cannot hold the server up at start."""
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
        if kind != stat.S_IFREG:
            raise TokenFileError(f"the MCP token file {path} is a {_KINDS.get(kind, 'special file')}, not a regular"
                                 " file: give the file that holds the token itself")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TokenFileError(f"the MCP token file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)  # the file opened, should it have been swapped since lstat
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"the MCP token file {path} is not a regular file: give the file itself")
        if st.st_mode & 0o077:
            raise TokenFileError(f"the MCP token file {path} is readable by other users: chmod 600 it")
        raw = _read_at_most(fd, 2 * MAX_TOKEN_CHARS + 1)  # room for blank lines around a longest token
    finally:
        os.close(fd)
    return _checked_token(path, raw)


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes: a huge file is known too long without reading it all."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _checked_token(path: Path, raw: bytes) -> str:
    """One token of visible ASCII, the only kind an HTTP client can send in `Authorization: Bearer`."""
    text = raw.strip(b" \t\r\n")
    if len(text) > MAX_TOKEN_CHARS:
        raise TokenFileError(f"the MCP token file {path} holds more than {MAX_TOKEN_CHARS} characters: it should"
                             f" hold one token of {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS}")
    if any(byte > 0x7F for byte in text):
        raise TokenFileError(f"the MCP token file {path} holds non-ASCII bytes: a token is visible ASCII characters"
                             " only (letters, digits, punctuation)")
    if any(byte in b" \t\r\n" for byte in text):
        raise TokenFileError(f"the MCP token file {path} holds more than one word: a token has no spaces or line"
                             " breaks inside")
    if any(byte < 0x21 or byte == 0x7F for byte in text):
        raise TokenFileError(f"the MCP token file {path} holds control characters (such as NUL): a token is visible"
                             " ASCII characters only")
    if len(text) < MIN_TOKEN_CHARS:
        held = f"a token of {len(text)} characters" if text else "no token"
        raise TokenFileError(f"the MCP token file {path} holds {held}: it must hold one token of at least"
                             f" {MIN_TOKEN_CHARS} characters")
    return text.decode("ascii")


class BearerAuth:
    """ASGI middleware: a request without `Authorization: Bearer <token>` gets 401 and reaches nothing else."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode("ascii")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = next((value for name, value in scope.get("headers", ()) if name == b"authorization"), b"")
            if not hmac.compare_digest(given, self._expected):
                await _plain(send, 401, b"unauthorized: send the token of clawmem mcp as Authorization: Bearer",
                             [(b"www-authenticate", b'Bearer realm="clawmem"')])
                return
        await self.app(scope, receive, send)


async def _plain(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


SESSION_GONE = ("session not found (closed after being idle, or to make room for a newer client):"
                " initialize a new session")


def _session_manager_class() -> type:
    from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    header = MCP_SESSION_ID_HEADER.lower().encode("ascii")

    class EvictingSessionManager(StreamableHTTPSessionManager):
        """At the session cap, a new session ends the least recently used one instead of being refused (503).

        A session's transport keeps its idle deadline (infinite while a request is in flight): the
        smallest finite deadline is the session used least recently. A GET stream is served without
        entering that count, so a session holding only its stream still ages, expires when idle and
        can be evicted. Cancelling the idle scope ends a session the way an idle timeout does (its
        stream closes too); it is forgotten at once, so its id answers 404 from then on.
        """

        evicted = 0

        async def _handle_stateful_request(self, scope: Any, receive: Any, send: Any) -> None:
            session_id = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == header), None)
            if session_id is None:
                await super()._handle_stateful_request(scope, receive, send)
                return
            transport = self._server_instances.get(session_id)
            if transport is None:
                await _session_gone(send)
                return
            idle = transport.idle_scope
            if (scope["method"] == "GET" and idle is not None and not idle.cancel_called
                    and session_id not in self._session_owners):
                await transport._handle_request(scope, receive, send)  # not `handle_request`: no hold on the session
                return
            await super()._handle_stateful_request(scope, receive, send)

        def _admit_session(self, requestor: Any) -> Any:
            if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
                self._evict_least_recently_used()
            return super()._admit_session(requestor)

        def _evict_least_recently_used(self) -> None:
            idle = [(transport.idle_scope.deadline, session_id, transport)
                    for session_id, transport in self._server_instances.items()
                    if transport.idle_scope is not None and math.isfinite(transport.idle_scope.deadline)]
            if not idle:
                return  # every session has a request in flight: refused, as the SDK does
            _, session_id, transport = min(idle, key=lambda item: item[0])
            self._server_instances.pop(session_id, None)
            self._session_owners.pop(session_id, None)
            if transport.idle_scope is not None:
                transport.idle_scope.cancel()
            EvictingSessionManager.evicted += 1

    return EvictingSessionManager


async def _session_gone(send: Any) -> None:
    """404 with a JSON-RPC error (as the SDK answers an unknown session), saying what the client should do."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": SESSION_GONE}}).encode()
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def build_app(server: Any, token: str, *, path: str, host: str, max_sessions: int = MAX_SESSIONS,
              idle_seconds: float = SESSION_IDLE_SECONDS, max_body: int = MAX_BODY_BYTES) -> Any:
    """The Starlette app serving `server` at `path`: bearer token, body limit, bounded sessions, Host/Origin checks."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.routing import Route

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{host}:*", "localhost:*"],
        allowed_origins=[f"http://{host}:*", "http://localhost:*"],
    )
    manager = _session_manager_class()(app=server, security_settings=security, max_request_body_size=max_body,
                                       session_idle_timeout=idle_seconds, max_sessions=max_sessions)
    endpoint = BearerAuth(StreamableHTTPASGIApp(manager), token)  # the manager bounds bodies (413)
    app = Starlette(routes=[Route(path, endpoint=endpoint)], lifespan=lambda app: manager.run())
    app.state.session_manager = manager
    return app
