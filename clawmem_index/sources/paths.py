"""The path rules: which names are memory, which paths `get` may read, `exclude`, and the dates in a path.

The rules live here once so the scanner, the watcher and `get` can never disagree about what a
memory file is. They look at names only (no I/O) but for `open_memory_file`, which opens the file
a client asked for through `clawmem_index.sources.files.open_beneath`.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from clawmem_index.errors import PathError
from clawmem_index.sources.files import OpenFile, open_beneath, path_key, shown

__all__ = [
    "MEMORY_DIR",
    "PROFILE_FILE",
    "ROOT_FILES",
    "USERS_DIR",
    "SESSION_SUFFIX",
    "SKIPPED_DIRS",
    "SessionsDir",
    "excluded",
    "file_date",
    "folder_date",
    "is_memory_path",
    "is_profile_path",
    "reads_annotations",
    "memory_key",
    "open_memory_file",
    "sessions_dir",
]

# OpenClaw's curated memory: MEMORY.md (memory.md too) and the user profile, USER.md, with one per person
# in users/<id>/USER.md (an id as OpenClaw accepts it). `user_profiles = false` excludes them
# (config.PROFILE_GLOBS).
PROFILE_FILE = "USER.md"
ROOT_FILES = ("MEMORY.md", "memory.md", PROFILE_FILE)
MEMORY_DIR = "memory"
USERS_DIR = "users"
_PROFILE_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}")
SESSION_SUFFIX = ".jsonl"
SKIPPED_DIRS = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__"})


@dataclass(frozen=True, slots=True)
class SessionsDir:
    """Where transcripts live (the `sessions_dir` setting, resolved) and how their index keys are made.

    Inside the workspace a transcript's key is workspace-relative (`sessions/2026-11-22-abc.jsonl`);
    outside it is absolute, as for an extra path. `anchor` and `names` say how to open the folder
    (beneath the workspace when inside it, so a symlink there is refused like anywhere else).
    """

    path: str
    anchor: str
    names: tuple[str, ...]
    key: str

    def key_of(self, rel_names: Sequence[str]) -> str:
        """The index key of the file at `rel_names` below this folder."""
        rel = "/".join(path_key(name) for name in rel_names)
        return f"{self.key}/{rel}" if self.key else rel

    def names_of(self, key: str) -> tuple[str, ...] | None:
        """The names (from `anchor`) of the transcript a key stands for, or None if it names none."""
        prefix = f"{self.key}/" if self.key else ""
        if not key.startswith(prefix) or not key.lower().endswith(SESSION_SUFFIX):
            return None
        parts = tuple(key[len(prefix):].split("/"))
        if any(not p or p in (".", "..") or p.startswith(".") or p in SKIPPED_DIRS for p in parts):
            return None
        return self.names + parts


def sessions_dir(workspace: Path | str, setting: str) -> SessionsDir:
    """The transcripts' folder for a `sessions_dir` setting (relative to the workspace, or absolute, `~` expanded)."""
    root = os.path.abspath(workspace)
    target = os.path.normpath(os.path.join(root, os.path.expanduser(setting)))
    rel = os.path.relpath(target, root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return SessionsDir(target, os.path.dirname(target), (os.path.basename(target),), path_key(target))
    names = tuple(p for p in rel.split(os.sep) if p != ".")
    return SessionsDir(target, root, names, "/".join(path_key(n) for n in names))


def excluded(key: str, patterns: Sequence[str]) -> bool:
    """Whether an index key matches one of the `exclude` globs (`*` within a folder, `**` across folders)."""
    return bool(patterns) and _globs(tuple(patterns)).fullmatch(key) is not None


@functools.cache
def _globs(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """All the globs as one pattern: a scan asks it once per file, not once per glob."""
    return re.compile("|".join(f"(?:{_glob(pattern).pattern})" for pattern in patterns))


@functools.cache
def _glob(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*/?|\*|\?)", pattern)
    wild = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wild.get(part, re.escape(part)) for part in parts))


_READABLE = "only MEMORY.md, USER.md, users/<id>/USER.md and memory/**/*.md are readable"
_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")
_FOLDER_DATE = re.compile(r"(?:^|/)(\d{4})/(\d\d?)/(\d\d?)(?!\d)")  # memory/2026/11/22.md, memory/2026/11/22/


def file_date(key: str) -> str | None:
    """The date of a daily file: the YYYY-MM-DD in its name (`memory/2026/2026-11-22.md`,
    `memory/log/2026-11-22-standup.md`), else its year, month and day folders (`memory/2026/11/22.md`,
    `memory/2026/11/22/notes.md`); None for a file with neither."""
    for match in reversed(list(_DATE.finditer(key.rsplit("/", 1)[-1]))):
        if (day := _iso_day(*match.groups())) is not None:
            return day
    return folder_date(key)


def folder_date(key: str) -> str | None:
    """The date a path's year/month/day folders give (the last such run in it), else None."""
    for match in reversed(list(_FOLDER_DATE.finditer(key))):
        if (day := _iso_day(*match.groups())) is not None:
            return day
    return None


def _iso_day(year: str, month: str, day: str) -> str | None:
    try:
        return dt.date(int(year), int(month), int(day)).isoformat()
    except ValueError:
        return None


def is_memory_path(rel: str, extra_paths: Sequence[str] = ()) -> bool:
    """Whether a workspace-relative path names a memory file (by name alone, no I/O)."""
    parts = PurePosixPath(rel).parts
    if not parts or not parts[-1].lower().endswith(".md"):
        return False
    if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
        return False
    if len(parts) == 1 and parts[0] in ROOT_FILES:
        return True
    if parts[0] == MEMORY_DIR and len(parts) > 1:
        return True
    if is_profile_path(rel):
        return True
    for extra in extra_paths:
        extra_parts = PurePosixPath(extra).parts
        if extra_parts and tuple(parts[: len(extra_parts)]) == extra_parts:
            return True
    return False


def is_profile_path(rel: str) -> bool:
    """Whether a workspace-relative path is a user profile: `USER.md` or `users/<id>/USER.md`."""
    parts = PurePosixPath(rel).parts
    if parts == (PROFILE_FILE,):
        return True
    return (len(parts) == 3 and parts[0] == USERS_DIR and parts[2] == PROFILE_FILE
            and _PROFILE_ID.fullmatch(parts[1]) is not None)


CURATED_FILES = ("MEMORY.md", "memory.md", PROFILE_FILE)  # where OpenClaw reads triggers and importance


def reads_annotations(key: str) -> tuple[bool, bool]:
    """Which annotations (clawmem_index.text.annotations) a memory file's entries carry: (triggers and importance,
    project keys). As OpenClaw's memory-core reads them: triggers and importance in the curated files at the
    root, project keys in every memory file but the shared user profile, USER.md."""
    return key in CURATED_FILES, key != PROFILE_FILE


def memory_key(requested: str, extra_paths: Sequence[str] = (), exclude: Sequence[str] = ()) -> str:
    """The index key a client's path names, or a PathError saying why it may not name one.

    A path straight from the file system (undecodable bytes as surrogate escapes) becomes its key.
    Refuses absolute paths, any `..` and anything that is not a memory file by name.
    """
    if not isinstance(requested, str) or not requested or "\0" in requested:
        raise PathError("path must be a non-empty workspace-relative path")
    key = path_key(requested)
    if key.startswith(("/", "\\", "~")) or os.path.isabs(key):
        raise PathError(f"absolute paths are refused: {shown(key)} (give a path relative to the workspace)")
    parts = PurePosixPath(key).parts
    if ".." in parts:
        raise PathError(f"'..' is refused in paths: {shown(key)}")
    key = "/".join(parts)
    if key.lower().endswith(SESSION_SUFFIX):
        raise PathError(f"not a memory file: {shown(key)} (session transcripts are searched, not read with `get`;"
                        f" {_READABLE})")
    if not is_memory_path(key, extra_paths):
        raise PathError(f"not a memory file: {shown(key)} ({_READABLE})")
    if excluded(key, exclude):
        raise PathError(f"not a memory file: {shown(key)} is left out by the `exclude` setting")
    return key


def open_memory_file(workspace: Path, requested: str, extra_paths: Sequence[str] = (), *,
                     refuse_hardlinks: bool = False, exclude: Sequence[str] = ()) -> OpenFile:
    """A descriptor of the memory file a client asked for, opened beneath the workspace, or a PathError."""
    key = memory_key(requested, extra_paths, exclude)
    return open_beneath(str(workspace), key.split("/"), display=key, refuse_hardlinks=refuse_hardlinks)

