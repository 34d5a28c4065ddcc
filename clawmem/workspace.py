"""Which files are memory, and which paths `get` may read.

The rules live here once so the scanner, the watcher and `get` can never disagree about what a
memory file is.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from clawmem.errors import PathError

__all__ = ["MemoryFile", "is_memory_path", "resolve_memory_path", "scan", "stat_memory_file"]

ROOT_FILES = ("MEMORY.md", "memory.md")
MEMORY_DIR = "memory"
SKIPPED_DIRS = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__"})


@dataclass(frozen=True, slots=True)
class MemoryFile:
    """A memory file as the scanner saw it; `path` is the index key (workspace-relative, '/'-separated)."""

    path: str
    abs_path: str
    mtime_ns: int
    size: int
    source: str = "memory"


def scan(workspace: Path, extra_paths: Sequence[str] = ()) -> Iterator[MemoryFile]:
    """Every memory file of the workspace, symlinks never followed, hidden and tool folders skipped."""
    root = str(workspace)
    seen: set[tuple[int, int]] = set()
    for name in ROOT_FILES:
        found = _regular_file(os.path.join(root, name))
        if found is not None:
            # On a case-insensitive file system both names are one file: keep the first.
            key = (found.st_dev, found.st_ino)
            if key not in seen:
                seen.add(key)
                yield MemoryFile(name, os.path.join(root, name), found.st_mtime_ns, found.st_size)
    memory_dir = os.path.join(root, MEMORY_DIR)
    if _is_real_dir(memory_dir):
        yield from _walk(root, memory_dir)
    for extra in extra_paths:
        target = Path(extra).expanduser()
        target = target if target.is_absolute() else workspace / target
        if _is_real_dir(str(target)):
            if not _inside(str(target), memory_dir):
                yield from _walk(root, str(target))
        elif target.suffix.lower() == ".md":
            found = _regular_file(str(target))
            if found is not None:
                yield MemoryFile(_key(root, str(target)), str(target), found.st_mtime_ns, found.st_size)


def stat_memory_file(workspace: Path, rel: str, extra_paths: Sequence[str] = ()) -> MemoryFile | None:
    """One memory file by its index key, or None if it is gone or no longer a memory file (for targeted syncs)."""
    try:
        real = resolve_memory_path(workspace, rel, extra_paths)
        st = os.lstat(real)
    except (PathError, OSError):
        return None
    return MemoryFile(rel, str(real), st.st_mtime_ns, st.st_size)


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
    for extra in extra_paths:
        extra_parts = PurePosixPath(extra).parts
        if extra_parts and tuple(parts[: len(extra_parts)]) == extra_parts:
            return True
    return False


def resolve_memory_path(workspace: Path, requested: str, extra_paths: Sequence[str] = ()) -> Path:
    """The real file behind a path a client asked for, or a PathError saying why not.

    Refuses absolute paths, any `..`, symlinks at any depth and anything that is not a memory file,
    so no request can read outside the memory of this workspace.
    """
    if not requested or "\0" in requested:
        raise PathError("path must be a non-empty workspace-relative path")
    if requested.startswith(("/", "\\", "~")) or os.path.isabs(requested):
        raise PathError(f"absolute paths are refused: {requested!r} (give a path relative to the workspace)")
    rel = PurePosixPath(requested.replace("\\", "/"))
    if ".." in rel.parts:
        raise PathError(f"'..' is refused in paths: {requested!r}")
    rel_str = str(rel)
    if not is_memory_path(rel_str, extra_paths):
        raise PathError(f"not a memory file: {requested!r} (only MEMORY.md and memory/**/*.md are readable)")
    current = workspace
    for part in rel.parts:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise PathError(f"no such memory file: {rel_str!r}") from None
        except OSError as exc:
            raise PathError(f"cannot read {rel_str!r}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise PathError(f"symlinks are refused: {rel_str!r}")
    if not stat.S_ISREG(st.st_mode):
        raise PathError(f"not a regular file: {rel_str!r}")
    return current


def _walk(root: str, top: str) -> Iterator[MemoryFile]:
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if name not in SKIPPED_DIRS:
                    stack.append(entry.path)
            elif name.lower().endswith(".md") and entry.is_file(follow_symlinks=False):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                yield MemoryFile(_key(root, entry.path), entry.path, st.st_mtime_ns, st.st_size)


def _regular_file(path: str) -> os.stat_result | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _inside(path: str, parent: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(parent)]) == os.path.abspath(parent)


def _key(root: str, path: str) -> str:
    prefix = root.rstrip(os.sep) + os.sep
    if path.startswith(prefix):
        rel = path[len(prefix):]
    else:
        rel = os.path.relpath(path, root)
        if rel.startswith(".."):
            return path
    return rel.replace(os.sep, "/")
