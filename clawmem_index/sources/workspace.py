"""Which files are memory: the scan of a workspace (and of the transcripts' folder), a folder at a time.

What the scan sees is only a hint, since the files can change under it: reading goes through
`clawmem_index.sources.files.open_beneath`, which re-checks every step on descriptors. The path rules it
applies (what a memory file is named, `exclude`) live in `clawmem_index.sources.paths`, shared with the
watcher and `get`.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import os
import stat
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clawmem_index.errors import PathError
from clawmem_index.sources.files import (
    describe_mode,
    hardlink_reason,
    open_beneath,
    path_key,
    refusal_of,
    unescape_key,
)
from clawmem_index.sources.paths import (
    MEMORY_DIR,
    PROFILE_FILE,
    ROOT_FILES,
    SESSION_SUFFIX,
    SKIPPED_DIRS,
    USERS_DIR,
    SessionsDir,
    excluded,
    is_profile_path,
    open_memory_file,
    sessions_dir,
)

if TYPE_CHECKING:
    from clawmem_index.config import Settings

__all__ = [
    "MemoryFile",
    "Skipped",
    "path_key",
    "scan",
    "size_reason",
    "source_scope",
    "stat_memory_file",
    "stat_session_file",
]

MEMORY_SUFFIX = ".md"
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class MemoryFile:
    """A memory file as the scanner saw it; treat it as read-only (`as_read` and `replace` make new ones).

    `path` is the index key (workspace-relative and '/'-separated, absolute for an extra path
    outside the workspace; always valid UTF-8). `root` and `names` say how to open it: the folder to
    start from and the file system names below it. Not a frozen dataclass: a scan makes one per file,
    and a frozen one costs 0.8 us more to make (80 ms of a 100,000-file no-change sync).
    """

    path: str
    mtime_ns: int
    size: int
    source: str = "memory"
    root: str = ""
    names: tuple[str, ...] = ()
    nlink: int = 1

    @property
    def abs_path(self) -> str:
        """Where the file is, for messages (reads go through `root` and `names`, a folder at a time)."""
        return os.path.join(self.root, *self.names)

    def as_read(self, st: os.stat_result) -> MemoryFile:
        """This file with the stat of the descriptor that was read (the scan's may already be stale)."""
        return replace(self, mtime_ns=st.st_mtime_ns, size=st.st_size, nlink=st.st_nlink)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A path that looks like memory but is not indexed, and why (so nothing is left out silently)."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


Note = Callable[[Skipped], object]
_Found = tuple[MemoryFile, os.stat_result]


def scan(workspace: Path, extra_paths: Sequence[str] = (), skipped: list[Skipped] | None = None,
         exclude: Sequence[str] = (), *, memory: bool = True, sessions: SessionsDir | None = None,
         newest_first: bool = False, max_bytes: int = 0, refuse_hardlinks: bool = False) -> Iterator[MemoryFile]:
    """Every memory file of the workspace, symlinks never followed, hidden and tool folders skipped.

    With `sessions`, also every `*.jsonl` transcript below that folder (source "sessions"); without
    `memory`, only those. What looks like memory but cannot be indexed (a symlink, FIFO or device,
    an unreadable or too long path, a name whose key another file already has) is appended to
    `skipped` with the reason. Files whose key matches an `exclude` pattern are left out quietly:
    the user asked for that. A memory file larger than `max_bytes` (when not 0) is skipped with the
    reason: one huge file would hold the whole index (and its process's memory) while it is chunked.
    Transcripts are read a tail at a time, whatever their size. With `refuse_hardlinks`, a file with
    several links is skipped with the reason. Every caller (a sync, `status`, a query's check of
    pending files) so counts the same files: a file refused by one is never pending for another.

    `newest_first`: in each folder, names that start with a digit (dates) before the others, each in
    descending order, files before subfolders; so a scan cut short (a bounded check of what changed)
    sees the latest daily logs (`2026-11-26.md`, `2026/11/`) before older ones and before topical
    notes: those are the files an agent is writing.
    """
    note: Note = skipped.append if skipped is not None else _ignore
    found_all: Iterable[tuple[MemoryFile, os.stat_result]] = itertools.chain(
        _candidates(str(workspace), extra_paths, note, newest_first) if memory else (),
        _transcripts(sessions, note, newest_first) if sessions is not None else ())
    if exclude or max_bytes or refuse_hardlinks:
        found_all = ((found, st) for found, st in found_all
                     if _admitted(found, exclude, max_bytes, refuse_hardlinks, note))
    if not extra_paths:
        # One walk of one tree (the root files, memory/, transcripts named otherwise): no key comes twice.
        yield from (found for found, _ in found_all)
        return
    seen: dict[str, tuple[int, int]] = {}
    for found, st in found_all:
        known = seen.get(found.path)
        if known is None:
            seen[found.path] = (st.st_dev, st.st_ino)
            yield found
        elif known != (st.st_dev, st.st_ino):
            note(Skipped(found.path, "another file already has this index key"))


def source_scope(settings: Settings) -> tuple[bool, SessionsDir | None]:
    """`scan`'s `memory` and `sessions` arguments for the configured sources (sessions: None when off)."""
    sessions = sessions_dir(settings.workspace, settings.sessions_dir) if "sessions" in settings.sources else None
    return "memory" in settings.sources, sessions


def stat_memory_file(workspace: Path, rel: str, extra_paths: Sequence[str] = (),
                     skipped: list[Skipped] | None = None, exclude: Sequence[str] = (),
                     max_bytes: int = 0, refuse_hardlinks: bool = False) -> MemoryFile | None:
    """One memory file by its index key, or None if it is gone or no longer a memory file (for targeted syncs).

    A file that is there but may not be read (or that `scan` would skip: larger than `max_bytes`,
    hard-linked with `refuse_hardlinks`) is appended to `skipped` with the reason.
    """
    if excluded(path_key(rel), exclude):
        return None
    try:
        with open_memory_file(workspace, rel, extra_paths) as opened:
            st = opened.stat
            found = MemoryFile(opened.path, st.st_mtime_ns, st.st_size,
                               root=str(workspace), names=opened.names, nlink=st.st_nlink)
            note: Note = skipped.append if skipped is not None else _ignore
            return found if _admitted(found, (), max_bytes, refuse_hardlinks, note) else None
    except PathError as exc:
        why = refusal_of(exc)  # None: not a memory file by name, so not one a targeted sync may look at
        if why is not None and not why.missing and skipped is not None:
            skipped.append(Skipped(why.path, why.reason))
        return None


def stat_session_file(where: SessionsDir, key: str, skipped: list[Skipped] | None = None,
                      exclude: Sequence[str] = (), refuse_hardlinks: bool = False) -> MemoryFile | None:
    """One transcript by its index key, or None if it is gone or not a transcript (for targeted syncs)."""
    names = where.names_of(path_key(key))
    if names is None or excluded(path_key(key), exclude):
        return None
    try:
        with open_beneath(where.anchor, names, display=path_key(key)) as opened:
            st = opened.stat
            found = MemoryFile(opened.path, st.st_mtime_ns, st.st_size,
                               source="sessions", root=where.anchor, names=opened.names, nlink=st.st_nlink)
            note: Note = skipped.append if skipped is not None else _ignore
            return found if _admitted(found, (), 0, refuse_hardlinks, note) else None
    except PathError as exc:
        why = refusal_of(exc)
        if why is not None and not why.missing and skipped is not None:
            skipped.append(Skipped(why.path, why.reason))
        return None


def _admitted(found: MemoryFile, exclude: Sequence[str], max_bytes: int, refuse_hardlinks: bool,
              note: Note) -> bool:
    """Not excluded (left out quietly), nor too large or hard-linked when refused (noted)."""
    if excluded(found.path, exclude):
        return False
    if refuse_hardlinks and found.nlink > 1:
        note(Skipped(found.path, hardlink_reason(found.nlink)))
        return False
    return not (max_bytes and found.size > max_bytes and _too_large(found, max_bytes, note))


def _too_large(found: MemoryFile, max_bytes: int, note: Note) -> bool:
    """Whether a memory file is over `max_bytes` (then noted as skipped); a transcript never is."""
    if found.size <= max_bytes or found.source != "memory":
        return False
    note(Skipped(found.path, size_reason(found.size, max_bytes)))
    return True


def size_reason(size: int, max_bytes: int) -> str:
    return (f"larger than max_file_bytes ({size:,} > {max_bytes:,} bytes): not indexed; raise max_file_bytes"
            " (0: no limit) to index it")


# -- scanning ---------------------------------------------------------------------------------


def _candidates(root: str, extra_paths: Sequence[str], note: Note, newest_first: bool = False) -> Iterator[_Found]:
    """Memory files with their (device, inode); the same key may come twice when extra paths overlap."""
    yield from _root_files(root, note)
    yield from _profiles(root, note)
    memory_dir = os.path.join(root, MEMORY_DIR)
    if _real_dir(memory_dir, MEMORY_DIR, note):
        yield from _walk(root, (MEMORY_DIR,), MEMORY_DIR, note, newest_first=newest_first)
    for extra in extra_paths:
        target = os.path.normpath(os.path.join(root, os.path.expanduser(extra)))
        if not _inside(target, memory_dir):
            yield from _extra(root, target, note, newest_first)


def _transcripts(where: SessionsDir, note: Note, newest_first: bool = False) -> Iterator[_Found]:
    """Every `*.jsonl` below the sessions folder, recursively (the folder itself is not followed if a symlink)."""
    if _real_dir(where.path, where.key or ".", note):
        yield from _walk(where.anchor, where.names, where.key, note, SESSION_SUFFIX, source="sessions",
                         newest_first=newest_first)


def _root_files(root: str, note: Note) -> Iterator[_Found]:
    seen: set[tuple[int, int]] = set()
    for name in ROOT_FILES:
        st = _regular_file(os.path.join(root, name), name, note)
        # On a case-insensitive file system both names are one file: keep the first.
        if st is not None and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            yield _memory_file(root, (name,), name, st)


def _profiles(root: str, note: Note) -> Iterator[_Found]:
    """Each person's profile, `users/<id>/USER.md` (the folders are not followed if symlinks)."""
    users = os.path.join(root, USERS_DIR)
    if not _real_dir(users, USERS_DIR, note):
        return
    for name, kind, _ in sorted(_list_dir(users, USERS_DIR, note, stat_files=False)):
        key = f"{USERS_DIR}/{path_key(name)}/{PROFILE_FILE}"
        if not is_profile_path(key):
            continue
        if kind == "link":
            note(Skipped(f"{USERS_DIR}/{path_key(name)}", "symlink, not followed"))
        elif kind == "dir":
            st = _regular_file(os.path.join(users, name, PROFILE_FILE), key, note)
            if st is not None:
                yield _memory_file(root, (USERS_DIR, name, PROFILE_FILE), key, st)


def _extra(root: str, target: str, note: Note, newest_first: bool = False) -> Iterator[_Found]:
    """An extra folder or file: opened from the workspace when inside it, else from its own parent."""
    rel = os.path.relpath(target, root)
    names: tuple[str, ...]
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        anchor, names, key = os.path.dirname(target), (os.path.basename(target),), path_key(target)
    else:
        anchor, names = root, tuple(p for p in rel.split(os.sep) if p != ".")
        key = path_key("/".join(names))
    try:
        st = os.lstat(target)
    except OSError as exc:
        _note_error(note, key, exc)
        return
    if stat.S_ISDIR(st.st_mode):
        yield from _walk(anchor, names, key, note, newest_first=newest_first)
    elif (stat.S_ISLNK(st.st_mode) or target.lower().endswith(".md")) and _check_file(st, key, note):
        yield _memory_file(anchor, names, key, st)


def _walk(anchor: str, names: tuple[str, ...], key: str, note: Note, suffix: str = MEMORY_SUFFIX,
          source: str = "memory", *, newest_first: bool = False) -> Iterator[_Found]:
    """The files named `*suffix` below `anchor/names`, a folder at a time (no descriptor is held between folders).

    A folder's files come before its subfolders'; with `newest_first`, both in `scan`'s order, and a
    folder's files are lstat'ed as they are reached (a batch at a time), not all before the first:
    a bounded check of a flat folder of 20,000 daily logs sees the latest within its bound."""
    stack = [(names, key)]
    while stack:
        dir_names, dir_key = stack.pop()
        folder = os.path.join(anchor, *dir_names)
        entries: Iterable[_Entry]
        siblings: Collection[str]  # looked in only for a name that is not its own key (rare)
        if newest_first:  # dated names (they start with a digit) first, the latest first
            found_names = _names(folder, dir_key, note)
            entries = _stat_as_reached(folder, dir_key, _newest_first(found_names), note, suffix)
            siblings = found_names
        else:
            listed = _list_dir(folder, dir_key, note, suffix)
            siblings = {name for name, _, _ in listed}
            entries = listed
        subfolders: list[tuple[tuple[str, ...], str]] = []
        for name, kind, st in entries:
            name_key = path_key(name)
            entry_key = f"{dir_key}/{name_key}" if dir_key else name_key
            if isinstance(st, OSError):
                _note_error(note, entry_key, st)
                continue
            if kind == "link":
                note(Skipped(entry_key, "symlink, not followed"))
                continue
            problem = None if name_key == name else _name_problem(name, siblings)
            if problem is not None:
                note(Skipped(entry_key, problem))
            elif kind == "dir":
                subfolders.append((dir_names + (name,), entry_key))
            elif st is not None and _check_file(st, entry_key, note):
                yield _memory_file(anchor, dir_names + (name,), entry_key, st, source)
        stack.extend(reversed(subfolders) if newest_first else subfolders)  # the last pushed is walked first


_Entry = tuple[str, str, os.stat_result | OSError | None]
_STAT_BATCH = 256  # files lstat'ed per opening of their folder when stats are taken as reached


def _stat_as_reached(path: str, key: str, names: list[str], note: Note, suffix: str) -> Iterator[_Entry]:
    """`_list_dir`'s entries for `names`, in their order, each lstat'ed through the folder (opened O_NOFOLLOW
    again) a batch at a time: the first comes without waiting for the last. The lstat tells a folder or a
    symlink from a file, so the names come from one `os.listdir` (a fifth of the CPU of a `scandir` of a
    flat folder of 20,000 notes, looked at entry by entry). A file gone meanwhile is not yielded; a folder
    that cannot be opened again is noted and ends the listing."""
    for start in range(0, len(names), _STAT_BATCH):
        try:
            fd = os.open(path, _LIST_FLAGS)
        except OSError as exc:
            _note_error(note, key or ".", exc)
            return
        done: list[_Entry] = []
        try:
            for name in names[start:start + _STAT_BATCH]:
                if name.startswith("."):
                    continue
                candidate = name.lower().endswith(suffix)
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted since the listing: as if listed a moment later
                except OSError as exc:
                    if candidate:
                        done.append((name, "file", exc))
                    continue
                if stat.S_ISLNK(st.st_mode):
                    done.append((name, "link", None))
                elif stat.S_ISDIR(st.st_mode):
                    if name not in SKIPPED_DIRS:
                        done.append((name, "dir", None))
                elif candidate:
                    done.append((name, "file", st))
        finally:
            os.close(fd)
        yield from done


def _newest_first(names: list[str]) -> list[str]:
    """Names that start with a digit 0-9 (dates), then the others, each in descending order.

    Sorted once (a folder's names are unique; a key function took 45 ms at 20,000), the names that
    start with a digit are one run, found by bisection rather than by looking at every name.
    """
    names.sort()
    low, high = bisect.bisect_left(names, "0"), bisect.bisect_left(names, ":")
    return names[low:high][::-1] + names[high:][::-1] + names[:low][::-1]


def _names(path: str, key: str, note: Note) -> list[str]:
    """The names in a folder (hidden ones are left out as they are reached, see `_stat_as_reached`)."""
    try:
        fd = os.open(path, _LIST_FLAGS)
    except OSError as exc:
        _note_error(note, key or ".", exc)
        return []
    try:
        return os.listdir(fd)
    except OSError as exc:
        _note_error(note, key or ".", exc)
        return []
    finally:
        os.close(fd)


def _list_dir(path: str, key: str, note: Note, suffix: str = MEMORY_SUFFIX, *,
              stat_files: bool = True) -> list[_Entry]:
    """(name, "link" | "dir" | "file", stat) for the entries of a folder that may hold memory.

    Hidden entries, tool folders and files not named *suffix are left out. The kind comes from the
    folder listing (no system call); only candidate files are lstat'ed, while the folder is open
    (without `stat_files`: not at all, their stat is None). Opened O_NOFOLLOW, so a symlink swapped
    in for the folder since its check is not listed.
    """
    try:
        fd = os.open(path, _LIST_FLAGS)
    except OSError as exc:
        _note_error(note, key or ".", exc)
        return []
    entries: list[_Entry] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                name = entry.name
                if name.startswith("."):
                    continue
                try:
                    if entry.is_symlink():
                        entries.append((name, "link", None))
                    elif entry.is_dir(follow_symlinks=False):
                        if name not in SKIPPED_DIRS:
                            entries.append((name, "dir", None))
                    elif name.lower().endswith(suffix):
                        entries.append((name, "file", entry.stat(follow_symlinks=False) if stat_files else None))
                except OSError as exc:
                    entries.append((name, "file", exc))
    except OSError as exc:
        _note_error(note, key or ".", exc)
    finally:
        os.close(fd)
    return entries


def _name_problem(name: str, siblings: Collection[str]) -> str | None:
    """Why a name cannot have its own key: every key must open exactly the file it was given to."""
    key = path_key(name)
    if key == name:
        return None
    if unescape_key(key) != name:
        return "its name mixes undecodable bytes with a literal '\\x..': it has no unambiguous index key"
    if key in siblings:
        return f"its index key is the name of another entry here ({key!r}), which is indexed instead"
    return None


def _memory_file(anchor: str, names: tuple[str, ...], key: str, st: os.stat_result,
                 source: str = "memory") -> _Found:
    return MemoryFile(key, st.st_mtime_ns, st.st_size, source, anchor, names, st.st_nlink), st


def _regular_file(path: str, key: str, note: Note) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        _note_error(note, key, exc)
        return None
    return st if _check_file(st, key, note) else None


def _check_file(st: os.stat_result, key: str, note: Note) -> bool:
    if stat.S_ISREG(st.st_mode):
        return True
    kind = "symlink, not followed" if stat.S_ISLNK(st.st_mode) else f"not a regular file ({describe_mode(st.st_mode)})"
    note(Skipped(key, kind))
    return False


def _real_dir(path: str, key: str, note: Note) -> bool:
    try:
        st = os.lstat(path)
    except OSError as exc:
        _note_error(note, key, exc)
        return False
    if stat.S_ISDIR(st.st_mode):
        return True
    note(Skipped(key, "symlink, not followed" if stat.S_ISLNK(st.st_mode) else "not a folder"))
    return False


def _note_error(note: Note, key: str, exc: OSError) -> None:
    """Report a path that could not be read; one that vanished while scanning is simply gone."""
    if exc.errno != errno.ENOENT:
        note(Skipped(key, f"cannot read: {(exc.strerror or str(exc)).lower()}"))


def _inside(path: str, parent: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(parent)]) == os.path.abspath(parent)


def _ignore(_: Skipped) -> None:
    return None
