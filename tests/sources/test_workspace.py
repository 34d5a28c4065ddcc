from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hostile import make_long_path

from clawmem_index.errors import PathError
from clawmem_index.sources.paths import file_date, is_memory_path, memory_key, open_memory_file, reads_annotations
from clawmem_index.sources.workspace import Skipped, scan


def resolve(workspace: Path, requested: str) -> Path:
    """The file `get` would read for `requested` (a PathError saying why not)."""
    with open_memory_file(workspace, requested) as opened:
        return Path(workspace, *opened.names)


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


def test_user_profiles_are_memory_files(workspace: Path, write, tmp_path: Path) -> None:
    write("USER.md", "- Always answer briefly.")
    write("users/dana/USER.md", "x")
    write("users/bob_2/USER.md", "x")
    write("users/dana/notes.md", "x")  # only the profile of a person's folder
    write("users/-bad/USER.md", "x")  # not an id OpenClaw accepts
    write("users/.hidden/USER.md", "x")
    write("users/dana/deeper/USER.md", "x")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "USER.md").write_text("secret")
    os.symlink(outside, workspace / "users" / "linked")
    skipped: list[Skipped] = []
    assert {f.path for f in scan(workspace, skipped=skipped)} == \
        {"USER.md", "users/dana/USER.md", "users/bob_2/USER.md"}
    assert Skipped("users/linked", "symlink, not followed") in skipped
    assert is_memory_path("users/dana/USER.md") and not is_memory_path("users/dana/notes.md")
    assert resolve(workspace, "users/dana/USER.md") == workspace / "users" / "dana" / "USER.md"
    with pytest.raises(PathError, match="USER.md, users/<id>/USER.md"):
        resolve(workspace, "users/dana/notes.md")


def test_which_annotations_a_file_carries_are_memory_cores() -> None:
    assert reads_annotations("MEMORY.md") == (True, True)
    assert reads_annotations("USER.md") == (True, False)  # the shared profile is never scoped to a repository
    assert reads_annotations("users/dana/USER.md") == (False, True)
    assert reads_annotations("memory/2026-11-30.md") == (False, True)


def test_a_symlinked_users_folder_is_not_followed(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "people"
    (outside / "dana").mkdir(parents=True)
    (outside / "dana" / "USER.md").write_text("secret")
    os.symlink(outside, workspace / "users")
    skipped: list[Skipped] = []
    assert paths(workspace) == set()
    assert {f.path for f in scan(workspace, skipped=skipped)} == set()
    assert Skipped("users", "symlink, not followed") in skipped
    with pytest.raises(PathError, match="symlink"):
        resolve(workspace, "users/dana/USER.md")


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


def test_a_file_under_overlapping_paths_is_found_once(workspace: Path, write, tmp_path: Path) -> None:
    write("memory/a.md", "x")
    write("notes/sub/b.md", "x")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "c.md").write_text("x")
    found = [f.path for f in scan(workspace, ("memory", "notes", "notes/sub", str(outside), str(outside / "sub")))]
    assert sorted(found) == sorted(["memory/a.md", "notes/sub/b.md", f"{outside}/sub/c.md"])


def test_newest_first_walks_dated_names_first_latest_first(workspace: Path, write) -> None:
    for rel in ("MEMORY.md", "memory/2026-01-01.md", "memory/2026-02-01.md", "memory/people.md",
                "memory/2025/12/31.md", "memory/2026/01/02.md", "memory/2026/01/03.md", "memory/projects/x.md"):
        write(rel, "x")
    assert [f.path for f in scan(workspace, newest_first=True)] == [
        "MEMORY.md", "memory/2026-02-01.md", "memory/2026-01-01.md", "memory/people.md",
        "memory/2026/01/03.md", "memory/2026/01/02.md", "memory/2025/12/31.md", "memory/projects/x.md"]
    assert sorted(f.path for f in scan(workspace)) == sorted(f.path for f in scan(workspace, newest_first=True))


def test_newest_first_takes_each_files_stat_when_it_reaches_it(workspace: Path, write,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A bounded check of a flat folder of daily logs must not lstat 20,000 files before the newest: stats are
    taken a batch at a time as the walk reaches them. So what happens to a later file after the first is
    yielded is what the walk reports: a file deleted meanwhile is not yielded, one swapped for a symlink is
    skipped as one, and a file listed with its stat up front (the eager walk) would have been yielded as it was."""
    from clawmem_index.sources import workspace as workspace_module

    monkeypatch.setattr(workspace_module, "_STAT_BATCH", 8)
    days = [f"memory/2026-{month:02d}-{day:02d}.md" for month in (1, 2, 3) for day in range(1, 21)]
    for rel in days:
        write(rel, f"log {rel}")
    skipped: list[Skipped] = []
    walk = scan(workspace, skipped=skipped, newest_first=True)
    assert next(walk).path == "memory/2026-03-20.md"
    (workspace / "memory/2026-01-05.md").unlink()
    (workspace / "memory/2026-01-04.md").unlink()
    (workspace / "memory/2026-01-04.md").symlink_to(workspace / "memory/2026-01-03.md")
    gone = {"memory/2026-03-20.md", "memory/2026-01-05.md", "memory/2026-01-04.md"}
    assert [f.path for f in walk] == sorted(set(days) - gone, reverse=True)
    assert {s.path: s.reason for s in skipped} == {"memory/2026-01-04.md": "symlink, not followed"}


@pytest.mark.parametrize("key, day", [
    ("memory/2026-11-22.md", "2026-11-22"),
    ("memory/log/standup-2026-11-22.md", "2026-11-22"),
    ("memory/2026/11/22.md", "2026-11-22"),
    ("memory/2026/1/5.md", "2026-01-05"),
    ("memory/2026/11/22-standup.md", "2026-11-22"),
    ("memory/2026/11/22/notes.md", "2026-11-22"),
    ("memory/2026/11/2026-11-20.md", "2026-11-20"),  # the name's own date wins
    ("memory/2026/11/20/2026-13-40.md", "2026-11-20"),  # a name's impossible date: the folders'
    ("memory/2026/02/30.md", None),
    ("memory/2026/11/notes.md", None),
    ("memory/ids/2026/10/123.md", None),
    ("memory/x2026/11/22.md", None),
    ("MEMORY.md", None),
])
def test_a_files_date_comes_from_its_name_else_its_year_month_day_folders(key: str, day: str | None) -> None:
    assert file_date(key) == day


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
        resolve(workspace, bad)


def test_get_refuses_symlinks_at_any_depth(workspace: Path, write, tmp_path: Path) -> None:
    outside = tmp_path / "out"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "x.md").write_text("secret")
    os.symlink(outside / "sub", workspace / "memory" / "sub")
    os.symlink(outside / "sub" / "x.md", workspace / "memory" / "x.md")
    for rel in ("memory/sub/x.md", "memory/x.md"):
        with pytest.raises(PathError, match="symlink"):
            resolve(workspace, rel)


def test_get_resolves_a_real_memory_file(workspace: Path, write) -> None:
    path = write("memory/2026-11-22.md", "hello")
    assert resolve(workspace, "memory/2026-11-22.md") == path


# -- names that are not UTF-8, skipped paths ---------------------------------------------------


def byte_file(directory: Path, name: bytes, content: bytes = b"x") -> None:
    fd = os.open(os.fsencode(directory) + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


def scan_with_skipped(ws: Path, extra: tuple[str, ...] = ()) -> tuple[set[str], dict[str, str]]:
    skipped: list[Skipped] = []
    found = {f.path for f in scan(ws, extra, skipped)}
    return found, {s.path: s.reason for s in skipped}


def test_names_that_are_not_utf8_get_escaped_keys_and_the_rest_keep_theirs(workspace: Path, write) -> None:
    byte_file(workspace / "memory", b"b\xff.md")
    os.mkdir(os.fsencode(workspace / "memory") + b"/d\xe9")
    byte_file(workspace / "memory", b"d\xe9/n\xc3.md")
    write("memory/été.md", "x")
    found = paths(workspace)
    assert found == {"memory/b\\xff.md", "memory/d\\xe9/n\\xc3.md", "memory/été.md"}
    for key in found:
        key.encode("utf-8")
        resolve(workspace, key)
    assert resolve(workspace, os.fsdecode(b"memory/b\xff.md")).name == os.fsdecode(b"b\xff.md")


def test_an_outside_extra_path_with_a_byte_name_gets_a_utf8_absolute_key(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "notes"
    outside.mkdir()
    byte_file(outside, b"n\xff.md")
    (key,) = paths(workspace, (str(outside),))
    assert key == f"{outside}/n\\xff.md"
    key.encode("utf-8")


def test_two_files_with_one_key_index_the_literal_name_and_report_the_other(workspace: Path, write) -> None:
    write("memory/b\\xff.md", "literal")
    byte_file(workspace / "memory", b"b\xff.md", b"bytes")
    found, skipped = scan_with_skipped(workspace)
    assert found == {"memory/b\\xff.md"}
    assert "index key" in skipped["memory/b\\xff.md"]
    assert resolve(workspace, "memory/b\\xff.md").read_text() == "literal"


def test_a_name_mixing_bytes_and_a_literal_escape_is_reported(workspace: Path) -> None:
    byte_file(workspace / "memory", b"\xff\\x80.md")
    found, skipped = scan_with_skipped(workspace)
    assert found == set()
    assert "unambiguous" in skipped["memory/\\xff\\x80.md"]


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_symlinks_fifos_and_sockets_that_look_like_memory_are_reported(workspace: Path, write, tmp_path: Path) -> None:
    import socket

    (tmp_path / "t.md").write_text("x")
    os.symlink(tmp_path / "t.md", workspace / "memory" / "link.md")
    os.symlink(tmp_path, workspace / "memory" / "linkdir")
    os.mkfifo(workspace / "memory" / "pipe.md")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(workspace / "memory" / "sock.md"))
    write("memory/ok.md", "x")
    try:
        found, skipped = scan_with_skipped(workspace)
    finally:
        sock.close()
    assert found == {"memory/ok.md"}
    assert skipped == {"memory/link.md": "symlink, not followed", "memory/linkdir": "symlink, not followed",
                       "memory/pipe.md": "not a regular file (FIFO)", "memory/sock.md": "not a regular file (socket)"}


def test_paths_longer_than_path_max_are_reported_not_dropped_silently(workspace: Path, write) -> None:
    make_long_path(workspace / "memory")
    write("memory/ok.md", "x")
    found, skipped = scan_with_skipped(workspace)
    assert found == {"memory/ok.md"}
    assert [reason for reason in skipped.values()] == ["cannot read: file name too long"]
    assert next(iter(skipped)).startswith("memory/ddd")


def test_unreadable_folders_are_reported(workspace: Path, write, monkeypatch) -> None:
    write("memory/locked/a.md", "x")
    write("memory/ok.md", "x")
    locked = str(workspace / "memory" / "locked")
    if os.geteuid() == 0:  # root reads any folder: make this one refuse as it would refuse anyone else
        real_open = os.open

        def refusing_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
            if path == locked:
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)
    os.chmod(locked, 0)
    try:
        found, skipped = scan_with_skipped(workspace)
    finally:
        monkeypatch.undo()
        os.chmod(locked, 0o755)
    assert found == {"memory/ok.md"}
    assert skipped == {"memory/locked": "cannot read: permission denied"}


def test_memory_key_turns_a_file_system_path_into_its_key() -> None:
    assert memory_key(os.fsdecode(b"memory/b\xff.md")) == "memory/b\\xff.md"
    assert memory_key("memory//./a.md") == "memory/a.md"
    assert memory_key("memory/back\\slash.md") == "memory/back\\slash.md", "a backslash is part of a name"


def test_the_watcher_keys_events_as_the_scanner_does(workspace: Path) -> None:
    from watchdog.events import FileCreatedEvent, FileMovedEvent

    from clawmem_index.service.watcher import WorkspaceWatcher

    byte_file(workspace / "memory", b"b\xff.md")
    watcher = WorkspaceWatcher(workspace, lambda reason, keys: None)
    raw = os.fsencode(workspace / "memory") + b"/b\xff.md"
    assert watcher.affected(FileCreatedEvent(raw)) == paths(workspace) == {"memory/b\\xff.md"}
    assert watcher.affected(FileCreatedEvent(os.fsdecode(raw))) == {"memory/b\\xff.md"}
    moved = FileMovedEvent(os.fsdecode(raw), f"{workspace}/memory/c.md")
    assert watcher.affected(moved) == {"memory/b\\xff.md", "memory/c.md"}


@pytest.mark.timeout(30)
def test_newest_first_finds_and_refuses_exactly_what_a_whole_scan_does(workspace: Path, write, tmp_path: Path) -> None:
    """The newest-first walk learns each entry's kind from its lstat, not from the listing: on a folder of every
    odd thing it must find the same files and give the same reasons as the walk that lists entry by entry."""
    import socket

    memory = workspace / "memory"
    for rel in ("MEMORY.md", "memory/2026-03-01.md", "memory/2026-02-28.md", "memory/Zeta.MD", "memory/notes.txt",
                "memory/.hidden.md", "memory/.git/x.md", "memory/node_modules/y.md", "memory/2026/03/02.md",
                "memory/dir.md/inside.md", "memory/b\\xff.md", "memory/0-first.md", "memory/ä-umlaut.md"):
        write(rel, "x")
    (tmp_path / "t.md").write_text("x")
    os.symlink(tmp_path / "t.md", memory / "link.md")
    os.symlink(tmp_path, memory / "2026-link")
    os.symlink(tmp_path, memory / "node_modules-link")
    os.mkfifo(memory / "pipe.md")
    byte_file(memory, b"b\xff.md", b"bytes")
    byte_file(memory, b"\xff\\x80.md")
    make_long_path(memory)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(memory / "sock.md"))
    try:
        whole, newest = [], []
        found = {f.path for f in scan(workspace, (), whole)}
        found_newest = [f.path for f in scan(workspace, (), newest, newest_first=True)]
    finally:
        sock.close()
    assert found == set(found_newest) and len(found_newest) == len(found)
    assert found >= {"memory/2026-03-01.md", "memory/Zeta.MD", "memory/dir.md/inside.md", "memory/2026/03/02.md"}
    assert sorted((s.path, s.reason) for s in newest) == sorted((s.path, s.reason) for s in whole)
    assert len(whole) >= 6
