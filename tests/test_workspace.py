from __future__ import annotations

import os
from pathlib import Path

import pytest

from clawmem.errors import PathError
from clawmem.workspace import is_memory_path, resolve_memory_path, scan


def paths(ws: Path, extra: tuple[str, ...] = ()) -> set[str]:
    return {f.path for f in scan(ws, extra)}


def test_scan_finds_memory_files_at_any_depth_and_nothing_else(workspace: Path, write) -> None:
    write("MEMORY.md", "x")
    write("memory/2026-11-22.md", "x")
    write("memory/projects/deep/er/note.md", "x")
    write("memory/notes.txt", "x")
    write("README.md", "x")
    write("docs/other.md", "x")
    assert paths(workspace) == {"MEMORY.md", "memory/2026-11-22.md", "memory/projects/deep/er/note.md"}


def test_scan_skips_hidden_and_tool_folders(workspace: Path, write) -> None:
    for folder in (".git", ".obsidian", "node_modules", ".venv", "venv", "__pycache__"):
        write(f"memory/{folder}/x.md", "x")
    write("memory/.hidden.md", "x")
    write("memory/kept.md", "x")
    assert paths(workspace) == {"memory/kept.md"}


def test_scan_never_follows_symlinks(workspace: Path, write, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "passwords.md").write_text("hunter2")
    os.symlink(outside, workspace / "memory" / "linked")
    os.symlink(outside / "passwords.md", workspace / "memory" / "pw.md")
    os.symlink(outside / "passwords.md", workspace / "MEMORY.md")
    write("memory/real.md", "x")
    assert paths(workspace) == {"memory/real.md"}


def test_memory_dir_itself_as_a_symlink_is_not_followed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "a.md").write_text("x")
    os.symlink(target, ws / "memory")
    assert paths(ws) == set()


def test_extra_paths_add_directories_and_single_files(workspace: Path, write) -> None:
    write("notes/a.md", "x")
    write("notes/sub/b.md", "x")
    write("TODO.md", "x")
    write("notes/c.txt", "x")
    assert paths(workspace, ("notes", "TODO.md")) == {"notes/a.md", "notes/sub/b.md", "TODO.md"}


def test_is_memory_path_matches_the_scanner_rules() -> None:
    assert is_memory_path("MEMORY.md")
    assert is_memory_path("memory/a/b.md")
    assert not is_memory_path("memory/.git/x.md")
    assert not is_memory_path("memory/x.txt")
    assert not is_memory_path("other.md")
    assert is_memory_path("notes/x.md", ("notes",))


@pytest.mark.parametrize("bad, why", [
    ("../outside.md", "'..'"),
    ("memory/../../etc/passwd.md", "'..'"),
    ("/etc/passwd", "absolute"),
    ("~/x.md", "absolute"),
    ("memory/notes.txt", "not a memory file"),
    ("README.md", "not a memory file"),
    ("", "non-empty"),
    ("memory/a\0.md", "non-empty"),
    ("memory/missing.md", "no such memory file"),
])
def test_get_paths_are_refused_with_a_reason(workspace: Path, write, bad: str, why: str) -> None:
    write("memory/notes.txt", "x")
    write("README.md", "x")
    with pytest.raises(PathError, match=why):
        resolve_memory_path(workspace, bad)


def test_get_refuses_symlinks_at_any_depth(workspace: Path, write, tmp_path: Path) -> None:
    outside = tmp_path / "out"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "x.md").write_text("secret")
    os.symlink(outside / "sub", workspace / "memory" / "sub")
    os.symlink(outside / "sub" / "x.md", workspace / "memory" / "x.md")
    for rel in ("memory/sub/x.md", "memory/x.md"):
        with pytest.raises(PathError, match="symlink"):
            resolve_memory_path(workspace, rel)


def test_get_resolves_a_real_memory_file(workspace: Path, write) -> None:
    path = write("memory/2026-11-22.md", "hello")
    assert resolve_memory_path(workspace, "memory/2026-11-22.md") == path
