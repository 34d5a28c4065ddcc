"""The exception tree: every failure a user can see is one of these.

    ClawmemError
    ├── ConfigError            a bad setting (names the key)            exit 1, rpc -32010
    │   └── TokenFileError     an MCP token file no client could use    exit 2
    ├── PathError              a path `get` refuses or cannot find      exit 1, rpc -32011
    ├── QueryError             a query that cannot be answered          exit 1, rpc -32012
    ├── ExtraNotInstalled      an optional part whose extra is missing  exit 1, rpc -32013
    ├── ProviderError          the embedding provider failed            exit 1, rpc -32020
    │   ├── RateLimited        429 after all retries
    │   ├── ProviderTimeout    timeouts / 5xx after all retries
    │   ├── AuthError          the provider refused our credentials
    │   ├── ProviderReleased   its model process was ended for good (a reload replaced it)
    │   └── ProviderUnavailable  an explicitly chosen provider cannot start (no key, no model, no SDK)
    ├── StoreError             a write the index refused for one item (that file is not indexed; the rest go on)
    ├── IndexUnavailable       the index cannot be opened or is locked  exit 3, rpc -32030
    │   ├── IndexBusy          another process holds the sync lock
    │   ├── DiskFull           no space left where the index is written (the run stops, resumes later)
    │   ├── IndexCorrupt       the file is not a usable SQLite database (rebuilt by the next sync)
    │   ├── WorkspaceTaken     another folder writes this workspace of the shared index
    │   ├── ServerBusy         the daemon refused a client (connection cap)          rpc -32001
    │   └── DaemonUnreachable  the client lost or never had a connection (never sent by a daemon)
    └── ProtocolError          a malformed socket request               exit 2, rpc -32600

Each class carries its CLI exit code and JSON-RPC error code so the outer layers map errors
without a lookup table of their own.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "ClawmemError",
    "ConfigError",
    "DaemonUnreachable",
    "DiskFull",
    "ExtraNotInstalled",
    "IndexBusy",
    "IndexCorrupt",
    "IndexUnavailable",
    "PathError",
    "ProtocolError",
    "ProviderError",
    "ProviderReleased",
    "ProviderTimeout",
    "ProviderUnavailable",
    "QueryError",
    "RateLimited",
    "ServerBusy",
    "StoreError",
    "TokenFileError",
    "WorkspaceTaken",
]


class ClawmemError(Exception):
    exit_code = 1
    rpc_code = -32000


class ConfigError(ClawmemError):
    """A setting has a bad name, type or value; the message names the key."""

    rpc_code = -32010


class TokenFileError(ConfigError):
    """`clawmem mcp --http` cannot use its token file (missing, not a regular file, not one visible-ASCII token):
    a bad `--token-file` is a usage error, like any other option given a value it cannot take."""

    exit_code = 2


class PathError(ClawmemError):
    """`get` refused a path (outside the workspace, a symlink, not a memory file) or it is missing."""

    rpc_code = -32011


class QueryError(ClawmemError):
    """A search request that cannot be answered as asked (bad mode, empty query...)."""

    rpc_code = -32012


class ExtraNotInstalled(ClawmemError):
    """An optional part of clawmem (`clawmem mcp`) whose packages are not installed; the message names the extra."""

    rpc_code = -32013


class ProviderError(ClawmemError):
    """The embedding provider failed for good (after its retries)."""

    rpc_code = -32020


class ProviderReleased(ProviderError):
    """The provider's model process was ended for good (a reload replaced it, or the daemon is stopping):
    whoever still held it should take the current one."""


class RateLimited(ProviderError):
    """The provider kept answering 429."""


class ProviderTimeout(ProviderError):
    """The provider kept timing out or answering 5xx."""


class AuthError(ProviderError):
    """The provider refused the credentials; retrying will not help."""


class ProviderUnavailable(ProviderError):
    """A provider the user chose by name cannot start here (no API key, model missing, SDK not installed)."""


class StoreError(ClawmemError):
    """A write the index's database refused (a value it cannot hold, a constraint), in the store's own words: the
    engine leaves that one file out and goes on, whichever database refused it."""


class IndexUnavailable(ClawmemError):
    """The index file cannot be opened, or the daemon cannot be reached."""

    exit_code = 3
    rpc_code = -32030


class WorkspaceTaken(IndexUnavailable):
    """Another folder (on this host or another) writes the shared index's workspace of this name: two
    writers of one name would each delete the other's files from it. `clawmem take-over` moves it here."""


class IndexBusy(IndexUnavailable):
    """Another process holds the workspace's sync lock."""


class DiskFull(IndexUnavailable):
    """No space left where the index is written: no file's fault, so the run stops (and resumes later)."""


class IndexCorrupt(IndexUnavailable):
    """The index file is not a database or is damaged; it is disposable, so a sync rebuilds it."""


class ServerBusy(IndexUnavailable):
    """The daemon turned a client away (every connection slot busy); the CLI then reads the index itself."""

    rpc_code = -32001


class DaemonUnreachable(IndexUnavailable):
    """No answer from the daemon's socket (nothing listening, connection lost, no reply in time)."""


class ProtocolError(ClawmemError):
    """A socket request that is not valid JSON-RPC."""

    exit_code = 2
    rpc_code = -32600
