"""What a workspace watch covers: the roots to watch, and the index keys a file event may have changed.

Only what can hold memory is watched, because a workspace is often a code repository too: a recursive watch on
it would spend an inotify watch on every folder of `.git`, `node_modules` or a build tree (exhausting the
user's limit, or making the polling fallback stat them all) and wake the daemon for every build. The roots are
the workspace itself, non-recursively (`MEMORY.md`, `USER.md`, and `memory/`, `users/` or an extra path
appearing, vanishing or moving), `memory/` recursively when it is a real folder, `users/` and each person's
folder in it non-recursively (only `users/<id>/USER.md` is memory) (never a symlink: the scanner does not
follow them either), each extra folder recursively, and the parent of an extra file (or of an extra folder not
there yet) non-recursively; with the sessions source on, the transcripts' folder recursively (or its parent
until it exists).

These are rules over paths (and an lstat of the roots that exist now): no thread, no observer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from clawmem_index.sources.files import path_key
from clawmem_index.sources.paths import (
    MEMORY_DIR,
    PROFILE_FILE,
    SKIPPED_DIRS,
    USERS_DIR,
    is_memory_path,
    is_profile_path,
    sessions_dir,
)

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent

__all__ = ["RootKey", "WatchedPaths", "within"]

# A watched root: (absolute directory, recursive).
RootKey = tuple[str, bool]

# Event types that are not changes: watchdog >= 5 reports opens and read-only closes, and our own
# sync reads every changed file, so counting them would make each sync trigger the next.
_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})
# Event types that can make a root appear, vanish or move.
_ROOT_EVENTS = frozenset({"created", "deleted", "moved"})


class WatchedPaths:
    """One workspace's roots to watch, and what an event below them means for the index."""

    def __init__(self, workspace: Path, extra_paths: Sequence[str] = (), sessions: str | None = None) -> None:
        """`workspace` is absolute; `sessions`: the `sessions_dir` setting when the sessions source is on."""
        self.workspace = workspace
        self._rel_extras, self._abs_extras = _split_extras(self.workspace, extra_paths)
        self._memory_root = os.path.join(self.workspace, MEMORY_DIR)
        self._users_root = os.path.join(self.workspace, USERS_DIR)  # users/<id>/USER.md
        self._extra_roots = tuple(os.path.normpath(self.workspace / e) for e in self._rel_extras) + self._abs_extras
        self._sessions = sessions_dir(self.workspace, sessions) if sessions is not None else None
        # Folders watched like extra folders: recursively, or through their parent until they exist.
        self._dir_roots = self._extra_roots + ((self._sessions.path,) if self._sessions is not None else ())

    def affected(self, event: FileSystemEvent) -> frozenset[str] | None:
        """The index keys an event may have changed: empty if none, None if it cannot be known."""
        if event.event_type in _IGNORED_EVENTS:
            return frozenset()
        if event.is_directory and event.event_type == "modified":
            return frozenset()  # a directory's mtime moves with every child: the child's own event counts
        keys: set[str] = set()
        for raw in _event_paths(event):
            key = self._key(raw, event.is_directory)
            if key is None:
                return None
            keys.update(key)
        return frozenset(keys)

    def _key(self, path: str, is_directory: bool) -> frozenset[str] | None:
        """The index key of one path: empty if not memory, None if it needs a full pass to know.

        Keys are made as the scanner makes them (`path_key`), so a name that is not valid UTF-8
        names the same key here as in the index.
        """
        transcript = self._session_key(path, is_directory)
        if transcript is None or transcript:
            return transcript
        rel = os.path.relpath(path, self.workspace)
        if rel.startswith(".."):
            # Outside the workspace (an extra path): index keys are absolute there; scan it all.
            return None if any(_under(path, extra, is_directory) for extra in self._abs_extras) else frozenset()
        rel = rel.replace(os.sep, "/")
        if is_directory:
            # Files may already be inside a folder created or moved in: only a full pass finds them.
            return None if _memory_dir(rel, self._rel_extras) else frozenset()
        return frozenset({path_key(rel)}) if is_memory_path(rel, self._rel_extras) else frozenset()

    def _session_key(self, path: str, is_directory: bool) -> frozenset[str] | None:
        """The transcript a path is (its key), empty if none, None for a folder in the sessions tree (full pass)."""
        where = self._sessions
        if where is None or not within(path, where.path):
            return frozenset()
        parts = Path(os.path.relpath(path, where.path)).parts if path != where.path else ()
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
            return frozenset()
        if is_directory:
            return None
        key = where.key_of(parts)
        return frozenset({key}) if parts and where.names_of(key) is not None else frozenset()

    def touched_roots(self, event: FileSystemEvent) -> frozenset[str]:
        """The paths of an event that are a memory root or one of its parents (the roots to redo)."""
        if event.event_type not in _ROOT_EVENTS:
            return frozenset()
        candidates = (self._memory_root, self._users_root, *self._dir_roots)
        # A person's folder under users/ coming or going is a root to watch (or to drop) too.
        return frozenset(path for path in _event_paths(event) if any(within(c, path) for c in candidates)
                         or (event.is_directory and os.path.dirname(path) == self._users_root))

    def wanted(self) -> dict[RootKey, tuple[int, int]]:
        """The roots that exist now as real folders, each with its (device, inode)."""
        found: dict[RootKey, tuple[int, int]] = {}
        workspace = _dir_identity(str(self.workspace), follow=True)  # it may be given through a symlink
        if workspace is not None:
            found[(str(self.workspace), False)] = workspace
        # users/ and each person's folder in it, not recursively: only users/<id>/USER.md is memory there, and a
        # code repository's own users/ tree must cost no watch.
        candidates: list[RootKey] = [(self._memory_root, True), (self._users_root, False),
                                     *((person, False) for person in self._people())]
        for extra in self._dir_roots:
            if _dir_identity(extra) is not None:
                candidates.append((extra, True))
            else:  # a single file, or a folder not there yet: its parent sees it come
                candidates.append((os.path.dirname(extra), False))
        for key in candidates:
            identity = _dir_identity(key[0])
            if identity is not None:
                found[key] = identity
        recursive = [path for path, rec in found if rec]
        return {key: identity for key, identity in found.items()
                if not any(within(key[0], outer) and (outer, True) != key for outer in recursive)}


    def _people(self) -> list[str]:
        """The folders of users/ that may hold a person's USER.md (a valid id; symlinks are left out below)."""
        try:
            names = os.listdir(self._users_root)
        except OSError:
            return []
        return [os.path.join(self._users_root, name) for name in names
                if is_profile_path(f"{USERS_DIR}/{name}/{PROFILE_FILE}")]


def _event_paths(event: FileSystemEvent) -> list[str]:
    paths = [event.src_path]
    if event.event_type == "moved":
        paths.append(event.dest_path)
    return [os.fsdecode(p) for p in paths if p]


def _dir_identity(path: str, *, follow: bool = False) -> tuple[int, int] | None:
    """(device, inode) of a folder, else None; a symlink counts only with `follow`."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def _split_extras(workspace: Path, extra_paths: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Extra paths as workspace-relative prefixes (inside) and absolute paths (outside the workspace)."""
    inside: list[str] = []
    outside: list[str] = []
    for extra in extra_paths:
        target = Path(extra).expanduser()
        absolute = os.path.normpath(target if target.is_absolute() else workspace / target)
        rel = os.path.relpath(absolute, workspace)
        if rel.startswith(".."):
            outside.append(absolute)
        else:
            inside.append(rel.replace(os.sep, "/"))
    return tuple(inside), tuple(outside)


def _memory_dir(rel: str, extras: Sequence[str]) -> bool:
    """A directory inside the memory tree (or an extra path): files may appear in it unannounced."""
    parts = PurePosixPath(rel).parts
    if not parts or any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
        return False
    if parts[0] == MEMORY_DIR or (parts[0] == USERS_DIR and len(parts) <= 2):  # a person's folder may hold USER.md
        return True
    return any(parts[: len(PurePosixPath(e).parts)] == PurePosixPath(e).parts for e in extras)


def _under(path: str, extra: str, is_directory: bool) -> bool:
    if path == extra:
        return True
    if not path.startswith(extra.rstrip(os.sep) + os.sep):
        return False
    parts = Path(os.path.relpath(path, extra)).parts
    if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
        return False
    return is_directory or path.lower().endswith(".md")
