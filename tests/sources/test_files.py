"""clawmem_index.sources.files: index keys for any name, opening beneath a root without following or blocking,
bounded reads."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import PathError, QueryError
from clawmem_index.sources import files
from clawmem_index.sources.files import (
    GET_MAX_BYTES,
    open_beneath,
    path_key,
    read_window,
    refusal_of,
    refused,
    unescape_key,
)
from clawmem_index.text.chunking import split_lines


def byte_file(directory: Path, name: bytes, content: bytes) -> None:
    fd = os.open(os.fsencode(directory) + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


# -- keys -------------------------------------------------------------------------------------


def test_valid_utf8_names_keep_their_key_and_undecodable_bytes_become_escapes() -> None:
    assert path_key("memory/ünïcode 日本.md") == "memory/ünïcode 日本.md"
    assert path_key(os.fsdecode(b"memory/b\xff.md")) == "memory/b\\xff.md"
    assert path_key(os.fsdecode(b"memory/\xc3(\x80.md")) == "memory/\\xc3(\\x80.md"
    assert unescape_key("memory/b\\xff.md") == os.fsdecode(b"memory/b\xff.md")
    assert unescape_key("memory/plain.md") is None
    assert unescape_key("memory/b\\x41.md") is None, "only bytes >= 0x80 are ever escaped"
    assert unescape_key("memory/\\xc3\\xa9.md") is None, "that is 'é', whose key is itself: no alias"


@hsettings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=24).filter(lambda b: b"/" not in b and b"\0" not in b))
def test_every_name_has_a_utf8_key_that_maps_back_to_it(raw: bytes) -> None:
    name = os.fsdecode(raw)
    key = path_key(name)
    key.encode("utf-8")
    if key == name:
        return
    if b"\\x" not in raw:
        assert unescape_key(key) == name


# -- opening ----------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "memory" / "sub").mkdir(parents=True)
    (root / "memory" / "sub" / "a.md").write_text("inside")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.md").write_text("secret")
    return root


def test_a_regular_file_is_opened_and_read_from_its_descriptor(tree: Path) -> None:
    with open_beneath(str(tree), ("memory", "sub", "a.md"), display="memory/sub/a.md") as opened:
        assert opened.names == ("memory", "sub", "a.md")
        assert opened.stat.st_size == 6
        assert files.read_all(opened.fd) == b"inside"


def test_symlinks_at_any_depth_are_refused(tree: Path) -> None:
    outside = tree.parent / "outside"
    os.symlink(outside, tree / "memory" / "linkdir")
    os.symlink(outside / "a.md", tree / "memory" / "link.md")
    for names in (("memory", "linkdir", "a.md"), ("memory", "link.md")):
        with pytest.raises(PathError, match="symlink"):
            open_beneath(str(tree), names, display="/".join(names))


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_fifos_sockets_devices_and_folders_are_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "memory" / "fifo.md")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tree / "memory" / "sock.md"))
    (tree / "memory" / "dir.md").mkdir()
    try:
        for name, kind in (("fifo.md", "FIFO"), ("sock.md", "socket"), ("dir.md", "folder")):
            with pytest.raises(PathError, match=f"not a regular file \\({kind}\\)"):
                open_beneath(str(tree), ("memory", name), display=name)
    finally:
        sock.close()
    with pytest.raises(PathError, match="character device"):
        open_beneath("/dev", ("null",), display="null")


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_what_is_swapped_in_after_the_check_is_refused_by_the_descriptor(tree: Path, monkeypatch) -> None:
    """Without the pre-check (as if the swap came right after it), the open itself must not follow or block."""
    monkeypatch.setattr(files, "_refuse_kind", lambda mode, display, want_dir: None)
    os.mkfifo(tree / "memory" / "fifo.md")
    os.symlink(tree.parent / "outside" / "a.md", tree / "memory" / "link.md")
    os.symlink(tree.parent / "outside", tree / "memory" / "linkdir")
    with pytest.raises(PathError, match="FIFO"):
        open_beneath(str(tree), ("memory", "fifo.md"), display="fifo")
    for names in (("memory", "link.md"), ("memory", "linkdir", "a.md")):
        with pytest.raises(PathError):
            open_beneath(str(tree), names, display="link")


def test_missing_names_and_names_that_leave_the_root_are_refused(tree: Path) -> None:
    with pytest.raises(PathError, match="no such memory file") as missing:
        open_beneath(str(tree), ("memory", "nope.md"), display="memory/nope.md")
    assert refusal_of(missing.value) == files.Refusal("memory/nope.md", "no such memory file", missing=True)
    assert type(missing.value) is PathError, "the class name is what clients see"
    for names in (("memory", "..", "..", "outside", "a.md"), ("memory/sub", "a.md"), ("memory", ""), ()):
        with pytest.raises(PathError):
            open_beneath(str(tree), names, display="x")


def test_hard_links_are_refused_only_when_asked(tree: Path) -> None:
    os.link(tree / "memory" / "sub" / "a.md", tree / "memory" / "twin.md")
    with open_beneath(str(tree), ("memory", "twin.md"), display="twin") as opened:
        assert opened.stat.st_nlink == 2
    with pytest.raises(PathError, match="hard-linked"):
        open_beneath(str(tree), ("memory", "twin.md"), display="twin", refuse_hardlinks=True)


def test_a_key_opens_its_literal_name_first_then_the_undecodable_one(tree: Path) -> None:
    byte_file(tree / "memory", b"b\xff.md", b"bytes")
    (tree / "memory" / "c\\xfe.md").write_text("literal")
    byte_file(tree / "memory", b"c\xfe.md", b"shadowed")
    for key, expected in (("b\\xff.md", b"bytes"), ("c\\xfe.md", b"literal")):
        with open_beneath(str(tree), ("memory", key), display=key) as opened:
            assert files.read_all(opened.fd) == expected


# -- bounded reading --------------------------------------------------------------------------


def window(path: Path, first: int = 1, count: int | None = None, max_bytes: int = GET_MAX_BYTES) -> files.Window:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_window(fd, first, count, max_bytes)
    finally:
        os.close(fd)


@hsettings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "é", "日", "\r", "\n", "\n", " ", "\udcff"]), max_size=40),
       st.integers(1, 12), st.one_of(st.none(), st.integers(1, 12)))
def test_an_uncapped_window_numbers_lines_as_split_lines_does(tmp_path_factory, pieces: list[str], first: int,
                                                              count: int | None) -> None:
    raw = "".join(pieces).encode("utf-8", "surrogateescape")
    path = tmp_path_factory.mktemp("w") / "f.md"
    path.write_bytes(raw)
    lines = split_lines(raw.decode("utf-8", "replace"))
    expected = lines[first - 1:] if count is None else lines[first - 1:first - 1 + count]
    got = window(path, first, count)
    assert (got.text, got.lines, got.truncated) == ("\n".join(expected), len(expected), False)


def test_a_capped_window_stops_before_the_first_line_that_does_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "f.md"
    path.write_text("aaaa\nbbbb\ncccc\n")
    assert window(path, max_bytes=9) == files.Window("aaaa\nbbbb", 2, True, 3)
    assert window(path, 1, 2, max_bytes=9) == files.Window("aaaa\nbbbb", 2, False, None)
    assert window(path, max_bytes=8) == files.Window("aaaa", 1, True, 2)
    assert window(path, 2, max_bytes=14) == files.Window("bbbb\ncccc", 2, False, None)
    assert window(path, 4) == files.Window("", 0)


def test_a_line_longer_than_the_cap_is_cut_on_a_character_boundary(tmp_path: Path) -> None:
    path = tmp_path / "f.md"
    path.write_text("日本語\nnext\n")
    for cap, text in ((1, ""), (3, "日"), (5, "日"), (6, "日本"), (8, "日本")):
        assert window(path, max_bytes=cap) == files.Window(text, 1, True, 2)
    path.write_bytes(b"ab\xff\xfecd\n")
    assert window(path, max_bytes=5) == files.Window("ab\ufffd", 1, True, 2), "replacement characters count as 3 bytes"


# -- MemoryIndex.get ---------------------------------------------------------------------------


@pytest.fixture
def index(settings: Settings) -> MemoryIndex:
    return MemoryIndex(settings)


def test_get_of_a_large_file_returns_whole_lines_under_the_cap_and_where_to_go_on(index: MemoryIndex, write) -> None:
    lines = [f"{i:05} " + "x" * 15_000 for i in range(70)]
    write("memory/big.md", "\n".join(lines) + "\n")
    got: list[str] = []
    start = 1
    while True:
        answer = index.get("memory/big.md", start)
        assert len(str(answer["text"]).encode()) <= GET_MAX_BYTES
        got += str(answer["text"]).split("\n")
        if not answer["truncated"]:
            assert "next_from" not in answer
            break
        assert answer["next_from"] == start + answer["lines"]  # type: ignore[operator]
        start = answer["next_from"]  # type: ignore[assignment]
    assert got == lines
    small = index.get("memory/big.md", 3, 2, max_bytes=40_000)
    assert small["text"] == "\n".join(lines[2:4]) and small["truncated"] is False


def test_get_of_a_single_huge_line_is_cut_and_points_past_it(index: MemoryIndex, write) -> None:
    write("memory/huge.md", "é" * (5 << 19) + "\nafter\n")  # 5 MiB of two-byte characters
    answer = index.get("memory/huge.md")
    assert answer["truncated"] is True and answer["next_from"] == 2 and answer["lines"] == 1
    assert answer["text"] == "é" * (GET_MAX_BYTES // 2)
    odd = index.get("memory/huge.md", max_bytes=1001)
    assert odd["text"] == "é" * 500
    assert index.get("memory/huge.md", 2)["text"] == "after"


def test_get_near_the_end_of_a_large_file(index: MemoryIndex, write) -> None:
    write("memory/log.md", "".join(f"line {i}\n" for i in range(1, 300_001)))
    answer = index.get("memory/log.md", 299_998)
    assert answer == {"path": "memory/log.md", "text": "line 299998\nline 299999\nline 300000", "from": 299_998,
                      "lines": 3, "truncated": False}
    assert index.get("memory/log.md", 300_001)["text"] == ""


@pytest.mark.parametrize("bad", [0, -1, True, "10", 1.5])
def test_get_validates_max_bytes(index: MemoryIndex, write, bad: object) -> None:
    write("memory/a.md", "x")
    with pytest.raises(QueryError, match="max_bytes"):
        index.get("memory/a.md", max_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_get_refuses_fifos_and_hard_links_when_told(tmp_path: Path, workspace: Path, write) -> None:
    write("memory/a.md", "alpha")
    os.link(workspace / "memory" / "a.md", workspace / "memory" / "b.md")
    os.mkfifo(workspace / "memory" / "f.md")
    overrides = {"index": str(tmp_path / "i.sqlite"), "embedding.provider": "none"}
    lenient = MemoryIndex(load_settings(workspace=workspace, overrides=overrides))
    assert lenient.get("memory/b.md")["text"] == "alpha"
    with pytest.raises(PathError, match="FIFO"):
        lenient.get("memory/f.md")
    strict = MemoryIndex(load_settings(workspace=workspace, overrides={**overrides, "refuse_hardlinks": True}))
    for path in ("memory/a.md", "memory/b.md"):
        with pytest.raises(PathError, match="hard-linked"):
            strict.get(path)


def test_a_refused_path_is_shown_as_typed_with_unprintable_characters_escaped() -> None:
    assert str(refused("memory/b\\xff.md", "no such memory file")) == "no such memory file: 'memory/b\\xff.md'"
    assert str(refused("memory/a\nb.md", "no such memory file")) == "no such memory file: 'memory/a\\nb.md'"
