"""Opening and reading memory files without trusting the file system to hold still.

Everything that reads a memory file (sync and `get`) goes through `open_beneath`: it walks from a
trusted folder one name at a time with directory descriptors and O_NOFOLLOW, so a symlink swapped
in at any depth after a check is refused instead of followed, and it opens the file O_NONBLOCK and
checks the descriptor it got (fstat), so a FIFO or device swapped in is refused instead of blocking
the reader. Only that descriptor is read.

Index keys are always valid UTF-8 (SQLite and JSON need it): a name with bytes that do not decode
keeps them as `\\xHH` escapes (`path_key`), and `unescape_key` maps such a key back to the name.

This module sits below sync and the engine: it must not import them or the store.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import BinaryIO, Self

from clawmem_index.errors import PathError

__all__ = [
    "GET_MAX_BYTES",
    "OpenFile",
    "Refusal",
    "count_lines",
    "Window",
    "describe_mode",
    "hardlink_reason",
    "open_beneath",
    "path_key",
    "read_all",
    "read_window",
    "refusal_of",
    "refused",
    "unescape_key",
]

GET_MAX_BYTES = 256 << 10  # default cap on the text one `get` returns
_BLOCK = 1 << 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: a terminal must not become ours.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_ESCAPE = re.compile(r"\\x([89a-f][0-9a-f])")


@dataclass(frozen=True)
class Refusal:
    """Why a memory file may not or cannot be read, attached to the PathError raised for it.

    Reports want the reason without the path, and a targeted sync must tell a file that is gone
    (normal) from one that is refused. It rides on a plain PathError because that class name is
    what clients see on the wire.
    """

    path: str
    reason: str
    missing: bool = False

    def error(self) -> PathError:
        exc = PathError(f"{self.reason}: {shown(self.path)}")
        exc.refusal = self  # type: ignore[attr-defined]
        return exc


def shown(path: str) -> str:
    """A path quoted for a message as the user would type it: a `\\xHH` key keeps its one backslash
    (repr would double it), and only characters that cannot be printed are escaped."""
    return "'" + "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in path) + "'"


def refused(path: str, reason: str, *, missing: bool = False) -> PathError:
    return Refusal(path, reason, missing).error()


def refusal_of(exc: BaseException) -> Refusal | None:
    """The Refusal a PathError from `open_beneath` carries (None for other errors)."""
    found = getattr(exc, "refusal", None)
    return found if isinstance(found, Refusal) else None


@dataclass(frozen=True)
class OpenFile:
    """A descriptor of a regular memory file, its fstat, and the file system names walked to reach it."""

    path: str
    fd: int
    stat: os.stat_result
    names: tuple[str, ...]

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class Window:
    """Lines of a file as `get` returns them; `next_from` is where to go on when `truncated`.

    `cut`: the one line of the window is only the start of a line longer than the byte cap (those
    who must not show part of a line, such as `context`, leave it out).
    """

    text: str
    lines: int
    truncated: bool = False
    next_from: int | None = None
    cut: bool = field(default=False, compare=False)


# -- index keys -------------------------------------------------------------------------------


def path_key(fs_path: str) -> str:
    """The index key of a file system path (a str with surrogate escapes, as os.scandir gives).

    Valid UTF-8 stays as it is, so existing keys keep their meaning; each byte that does not decode
    becomes `\\xHH`. Lossless, displayable, and always encodable as UTF-8.
    """
    try:
        fs_path.encode("utf-8")
        return fs_path
    except UnicodeEncodeError:
        pass
    try:
        raw = fs_path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # lone surrogates no file system gives: keep them visible, never crash
        raw = fs_path.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")


def unescape_key(key: str) -> str | None:
    """The file system name a key stands for when it is not literal, or None if it has no such reading.

    Only escapes of bytes >= 0x80 count, and only when the result maps back to the same key, so a
    key has at most two readings (literal, then unescaped) and every file has exactly one key.
    """
    if not _ESCAPE.search(key):
        return None
    pieces = _ESCAPE.split(key)
    raw = b"".join(bytes([int(p, 16)]) if i % 2 else p.encode("utf-8", "surrogatepass") for i, p in enumerate(pieces))
    name = raw.decode("utf-8", "surrogateescape")
    return name if name != key and path_key(name) == key else None


# -- opening ----------------------------------------------------------------------------------


def open_beneath(root: str, names: Sequence[str], *, display: str, follow_root: bool = True,
                 refuse_hardlinks: bool = False) -> OpenFile:
    """Open the regular file `root/names...` for reading, never leaving `root` and never blocking.

    Each name is tried literally, then unescaped (`unescape_key`) if nothing has the literal name.
    Raises PathError (carrying a `Refusal`, see `refusal_of`) naming `display` and why: a symlink
    or non-regular file at any depth, a missing name, a hard-linked file when `refuse_hardlinks`,
    or an OS error.
    """
    if not names:
        raise refused(display, "not a file")
    for name in names:
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise refused(display, "not a plain workspace path")
    try:
        fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW if follow_root else _DIR_FLAGS)
    except OSError as exc:
        raise refused(display, f"cannot open its folder ({_strerror(exc)})") from None
    walked: list[str] = []
    try:
        for name in names[:-1]:
            name, child = _open_at(fd, name, display, want_dir=True)
            os.close(fd)
            fd = child
            walked.append(name)
        name, file_fd = _open_at(fd, names[-1], display, want_dir=False)
        walked.append(name)
    finally:
        os.close(fd)
    try:
        st = os.fstat(file_fd)
        if not stat.S_ISREG(st.st_mode):
            raise refused(display, f"not a regular file ({describe_mode(st.st_mode)})")
        if refuse_hardlinks and st.st_nlink > 1:
            raise refused(display, hardlink_reason(st.st_nlink))
    except BaseException:
        os.close(file_fd)
        raise
    return OpenFile(display, file_fd, st, tuple(walked))


def _open_at(dir_fd: int, name: str, display: str, *, want_dir: bool) -> tuple[str, int]:
    """One step of the walk: (the name that exists, its descriptor)."""
    for candidate in _readings(name):
        try:
            if not want_dir:
                # Refuse what is plainly not a file before opening it (opening a device can have effects);
                # fstat after the open catches anything swapped in between.
                _refuse_kind(os.stat(candidate, dir_fd=dir_fd, follow_symlinks=False).st_mode, display, want_dir)
            return candidate, os.open(candidate, _DIR_FLAGS if want_dir else _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        except PathError:
            raise
        except OSError as exc:
            raise _explain(dir_fd, candidate, exc, display, want_dir) from None
    raise refused(display, "no such memory file", missing=True)


def _readings(name: str) -> tuple[str, ...]:
    alt = unescape_key(name)
    return (name,) if alt is None else (name, alt)


def _refuse_kind(mode: int, display: str, want_dir: bool) -> None:
    if stat.S_ISLNK(mode):
        raise refused(display, "symlinks are refused")
    if want_dir and not stat.S_ISDIR(mode):
        raise refused(display, f"a folder on the way is not a folder ({describe_mode(mode)})")
    if not want_dir and not stat.S_ISREG(mode):
        raise refused(display, f"not a regular file ({describe_mode(mode)})")


def _explain(dir_fd: int, name: str, exc: OSError, display: str, want_dir: bool) -> PathError:
    """Why an open failed: O_NOFOLLOW and O_DIRECTORY answer ELOOP/ENOTDIR, so look at what is there."""
    try:
        _refuse_kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode, display, want_dir)
    except PathError as refusal:
        return refusal
    except OSError:
        pass
    return refused(display, f"cannot open ({_strerror(exc)})")


def describe_mode(mode: int) -> str:
    """A file type in words, for reasons shown to users."""
    for test, word in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISREG, "regular file")):
        if test(mode):
            return word
    return "unknown type"


def hardlink_reason(nlink: int) -> str:
    return f"hard-linked files are refused ({nlink} links, refuse_hardlinks = true)"


def _strerror(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


# -- reading ----------------------------------------------------------------------------------


def read_all(fd: int) -> bytes:
    """The whole file behind a descriptor (for sync, which hashes and chunks all of it)."""
    with open(fd, "rb", closefd=False) as fh:
        return fh.read()


def read_window(fd: int, first: int, count: int | None, max_bytes: int) -> Window:
    """Lines `first`.. (`count` of them, or to the end) as text of at most `max_bytes` UTF-8 bytes.

    Streams the file: lines before `first` are counted in blocks, and no line is read further than
    the room left, so the cost is bounded by the answer, not the file. Lines split on "\\n" only, as
    `chunking.split_lines` does; invalid UTF-8 becomes U+FFFD. A window stops before a line that does
    not fit; a first line that alone does not fit is cut on a character boundary.
    """
    with open(fd, "rb", buffering=_BLOCK, closefd=False) as fh:
        if not _skip_lines(fh, first - 1):
            return Window("", 0)
        picked: list[str] = []
        used = 0
        while count is None or len(picked) < count:
            room = max_bytes - used - (1 if picked else 0)
            raw, complete = _read_line(fh, max(room, 0))
            if raw is None:
                break
            text = _decode(raw, final=complete)
            size = len(text.encode("utf-8"))
            if complete and size <= room:
                picked.append(text)
                used += size + (1 if len(picked) > 1 else 0)
                continue
            if picked:
                return Window("\n".join(picked), len(picked), True, first + len(picked))
            cut = text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
            return Window(cut, 1, True, first + 1, cut=True)
    return Window("\n".join(picked), len(picked))


def count_lines(fd: int) -> int:
    """The lines of a file as `read_window` numbers them (a last line without its newline counts), in blocks."""
    lines, last = 0, b"\n"
    with open(fd, "rb", buffering=0, closefd=False) as fh:
        fh.seek(0)
        while block := fh.read(_BLOCK):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def _skip_lines(fh: BinaryIO, n: int) -> bool:
    """Move past `n` lines, a block at a time; False if the file ends first (nothing left to show)."""
    while n > 0:
        block = fh.read(_BLOCK)
        if not block:
            return False
        found = block.count(b"\n")
        if found < n:
            n -= found
            continue
        end = -1
        for _ in range(n):
            end = block.index(b"\n", end + 1)
        fh.seek(end + 1 - len(block), io.SEEK_CUR)
        n = 0
    return True


def _read_line(fh: BinaryIO, limit: int) -> tuple[bytes | None, bool]:
    """The next line without its "\\n", read no further than `limit` bytes of content.

    Returns (None, False) at the end of the file, and complete=False when the line is longer than `limit`.
    """
    data = fh.readline(limit + 1)
    if not data:
        return None, False
    if data.endswith(b"\n"):
        return data[:-1], True
    return data, len(data) <= limit


def _decode(raw: bytes, *, final: bool) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # A line cut short may end inside a character: hold that tail back rather than mark it invalid.
        return codecs.getincrementaldecoder("utf-8")("replace").decode(raw, final=final)
