"""Opening an index file: made private, connected with apsw, its journal set, sqlite-vec loaded, its schema current.

Python's stdlib sqlite3 often cannot load extensions, so the connection is apsw (a current SQLite
with FTS5, able to load sqlite-vec everywhere).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import stat
from pathlib import Path

import apsw

from clawmem_index.errors import IndexCorrupt, IndexUnavailable
from clawmem_index.index.schema import check_migrated, migrate

__all__ = ["WAL_LIMIT", "checkpoint_by_limit", "connect", "make_private_dirs", "make_private_file"]

# Bytes the WAL file is cut back to once a checkpoint has emptied it. A rebuild's swap writes the whole
# index through the WAL, and without a limit the file keeps that size while any reader stays open
# (a daemon's readers always do): 9 GB beside a 9 GB index at 1M 1,536-d vectors.
WAL_LIMIT = 64 << 20


def connect(path: Path, *, create: bool, fast_unsafe: bool, read_only: bool) -> tuple[apsw.Connection, bool, str]:
    """The connection to the index file at `path`, with whether sqlite-vec loaded there (and if not, why).

    As `Store` opens it (see its parameters): a writer's is migrated, a reader's checked to need no migration.
    """
    if read_only:
        flags = apsw.SQLITE_OPEN_READONLY
    else:
        flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
    try:
        if create and not read_only:
            make_private_file(path)
        conn = apsw.Connection(str(path), flags=flags)
        conn.set_busy_timeout(10_000)
        if not fast_unsafe:
            _keep_wal_files(conn)
        if read_only:
            pass  # the writer set WAL mode; a reader joins it as it is
        elif fast_unsafe:
            # A rebuild writes a private file that is thrown away if anything fails: no journal needed.
            # SQLite's own page cache (2 MB): 64 MB was asked for here for a long time without taking
            # effect, and taking effect it added ~65 MB to a cold index's peak (20,000 notes: 259 MB against
            # 193 MB for the process tree) for no time gained (10.3 s both).
            _pragmas(conn, "journal_mode=OFF", "synchronous=OFF")
        else:
            _pragmas(conn, "journal_mode=WAL", "synchronous=NORMAL", f"journal_size_limit={WAL_LIMIT}")
        vec_loaded, vec_error = _load_sqlite_vec(conn)
        if read_only:
            check_migrated(conn, path)
        else:
            migrate(conn)
    except (apsw.NotADBError, apsw.CorruptError) as exc:
        raise IndexCorrupt(f"index {path} is damaged: {exc}") from exc
    except apsw.Error as exc:
        raise IndexUnavailable(f"cannot open index {path}: {exc}") from exc
    return conn, vec_loaded, vec_error


def checkpoint_by_limit(conn: apsw.Connection) -> None:
    """Checkpoint the WAL once it holds WAL_LIMIT bytes of pages rather than SQLite's 1,000 pages (4 MB): a first
    index written in place (readers search it as it grows) rewrites its hottest pages at every checkpoint; at
    100,000 notes SQLite's default cost ~5 s of a ~60 s cold index. Per connection: the writer's alone."""
    page = int(conn.execute("PRAGMA page_size").get)
    _pragmas(conn, f"wal_autocheckpoint={max(1000, WAL_LIMIT // page)}")


def _pragmas(conn: apsw.Connection, *settings: str) -> None:
    """Each PRAGMA in a statement of its own, run to its end: in one `execute`, apsw stops at the first
    that answers a row (journal_mode does) and the rest never run."""
    for setting in settings:
        conn.execute(f"PRAGMA {setting}").fetchall()


def _keep_wal_files(conn: apsw.Connection) -> None:
    """Leave the -wal and -shm files in place when the last connection closes (SQLITE_FCNTL_PERSIST_WAL).

    Opening a WAL index makes its -shm file when missing, and on a full disk that fails: a daemon
    restarted then (systemd does) could not even serve what is indexed. Kept, they need no new space.
    """
    keep = ctypes.c_int(1)
    conn.file_control("main", apsw.SQLITE_FCNTL_PERSIST_WAL, ctypes.addressof(keep))


def make_private_dirs(directory: Path, *, tighten: bool = False) -> None:
    """Create `directory` and any missing parents 0700, whatever the umask.

    Existing folders are left as they are unless `tighten` (folders that are clawmem's own, such as
    its cache, which older versions created 0755): then `directory` itself is made 0700 if we own it.
    """
    missing: list[Path] = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)
    if tighten and not missing:
        _make_private(directory, 0o700)


def make_private_file(path: Path, *, create: bool = True) -> None:
    """The index file and its journals 0600 (created so when missing and `create`), before SQLite opens it.

    The index holds the memory's text, so no other local user may read it. SQLite gives the -wal
    and -shm files it creates the database file's mode; existing ones are tightened here too.
    """
    make_private_dirs(path.parent)
    if create:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    for suffix in ("", "-wal", "-shm"):
        _make_private(Path(f"{path}{suffix}"), 0o600)


def _make_private(path: Path, mode: int) -> None:
    """chmod `path` to `mode` if we own it and others have any access (never following a symlink)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, mode, follow_symlinks=False)


def _load_sqlite_vec(conn: apsw.Connection) -> tuple[bool, str]:
    try:
        conn.enable_load_extension(True)
        conn.load_extension(_sqlite_vec_path())
        conn.enable_load_extension(False)
        return True, ""
    except (ImportError, apsw.Error) as exc:
        return False, str(exc)


def _sqlite_vec_path() -> str:
    """Where the sqlite-vec package keeps its extension, found without importing the package.

    `import sqlite_vec` pulls in numpy (0.12 s), a third of a CLI search's whole budget.
    """
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sqlite-vec package is not installed")
    return os.path.join(next(iter(spec.submodule_search_locations)), "vec0")
