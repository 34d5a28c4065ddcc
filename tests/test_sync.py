from __future__ import annotations

import os
from pathlib import Path

from clawmem.config import Settings
from clawmem.engine import MemoryIndex
from clawmem.search import SearchRequest


def hits(index: MemoryIndex, query: str) -> list[str]:
    answer = index.search(SearchRequest(query, max_results=20, min_score=0.0, mode="bm25"))
    return [f"{r['path']}:{r['start_line']}" for r in answer["results"]]  # type: ignore[index,union-attr]


def paths_found(index: MemoryIndex, query: str) -> set[str]:
    return {h.split(":")[0] for h in hits(index, query)}


def test_first_sync_indexes_every_memory_file(settings: Settings, write) -> None:
    write("MEMORY.md", "# Memory\n## Facts\n- the staging host is zephyr")
    write("memory/2026-11-22.md", "# Log\n- deployed quokka service")
    write("memory/projects/a/b.md", "# Deep\nnested wombat notes")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 3 and report.files_seen == 3
    assert paths_found(index, "zephyr") == {"MEMORY.md"}
    assert paths_found(index, "quokka") == {"memory/2026-11-22.md"}
    assert paths_found(index, "wombat") == {"memory/projects/a/b.md"}


def test_an_unchanged_file_is_not_read_again(settings: Settings, write) -> None:
    """Same mtime and size: the file is skipped without opening it, so a same-size rewrite goes unseen."""
    path = write("memory/a.md", "# A\nalpha bravo charlie")
    index = MemoryIndex(settings)
    index.sync()
    st = os.stat(path)
    path.write_text("# A\ndelta bravo charlie")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = index.sync()
    assert report.unchanged == 1 and report.bytes_read == 0
    assert paths_found(index, "alpha") == {"memory/a.md"}
    assert paths_found(index, "delta") == set()


def test_a_touched_file_is_read_but_its_chunks_are_kept(settings: Settings, write) -> None:
    path = write("memory/a.md", "# A\nalpha")
    index = MemoryIndex(settings)
    index.sync()
    before = index.reader().execute("SELECT seq, id FROM chunks")
    os.utime(path, ns=(1, 1_000_000_000))
    report = index.sync()
    assert report.touched == 1 and report.chunks_added == 0 and report.chunks_removed == 0
    assert index.reader().execute("SELECT seq, id FROM chunks") == before


def test_modify_delete_rename_and_nested_add_are_reflected(settings: Settings, write, workspace: Path) -> None:
    write("memory/a.md", "# A\nalpha content")
    write("memory/b.md", "# B\nbravo content")
    write("memory/c.md", "# C\ncharlie content")
    index = MemoryIndex(settings)
    index.sync()

    write("memory/a.md", "# A\nalpha content rewritten with xylophone")
    (workspace / "memory" / "b.md").unlink()
    (workspace / "memory" / "c.md").rename(workspace / "memory" / "renamed.md")
    write("memory/new/deeper/d.md", "# D\ndelta in a new folder")
    report = index.sync()

    assert (report.added, report.updated, report.removed) == (2, 1, 2)
    assert paths_found(index, "xylophone") == {"memory/a.md"}
    assert paths_found(index, "bravo") == set()
    assert paths_found(index, "charlie") == {"memory/renamed.md"}
    assert paths_found(index, "delta") == {"memory/new/deeper/d.md"}
    files, chunks = index.reader().counts()
    assert files == 3
    assert index.reader().execute("SELECT count(*) FROM chunks WHERE path IN ('memory/b.md', 'memory/c.md')") == [(0,)]


def test_an_edit_keeps_the_rows_of_unchanged_chunks(settings: Settings, write) -> None:
    sections = [f"## Section {i}\n" + f"words of section {i} " * 30 for i in range(5)]
    write("memory/long.md", "# Title\n" + "\n".join(sections))
    index = MemoryIndex(settings)
    index.sync()
    before = {row[1]: row for row in index.reader().execute("SELECT seq, hash, start_line FROM chunks")}
    sections.insert(0, "## Inserted\nnew words at the top\nand another line")
    write("memory/long.md", "# Title\n" + "\n".join(sections))
    report = index.sync()
    after = {row[1]: row for row in index.reader().execute("SELECT seq, hash, start_line FROM chunks")}
    kept = before.keys() & after.keys()
    assert len(kept) >= 4
    for h in kept:
        if before[h][2] > 1:
            assert after[h][0] == before[h][0], "an unchanged chunk keeps its row"
            assert after[h][2] == before[h][2] + 3, "and moves with its lines"
    assert report.chunks_added == 1 and report.chunks_kept >= 4


def test_symlinks_and_hidden_folders_are_not_indexed(settings: Settings, write, workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("# S\nclassified pineapple")
    os.symlink(secret, workspace / "memory" / "link.md")
    write("memory/.trash/old.md", "# O\nclassified pineapple")
    write("memory/real.md", "# R\nordinary")
    index = MemoryIndex(settings)
    index.sync()
    assert paths_found(index, "pineapple") == set()
    assert index.reader().counts()[0] == 1


def test_invalid_utf8_is_indexed_with_replacement_characters(settings: Settings, write) -> None:
    write("memory/broken.md", b"# Broken\nvalid words \xff\xfe then more kiwifruit\n\xc3")
    write("memory/fine.md", "# Fine\nok")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 2 and not report.errors
    assert paths_found(index, "kiwifruit") == {"memory/broken.md"}
    text = index.reader().execute("SELECT text FROM chunks WHERE path = 'memory/broken.md'")[0][0]
    assert "\ufffd" in text


def test_empty_files_are_tracked_without_chunks(settings: Settings, write) -> None:
    write("memory/empty.md", "")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 1
    assert index.reader().counts() == (1, 0)
    assert index.status()["pending_files"] == 0


def test_a_second_sync_with_nothing_changed_does_nothing(settings: Settings, write) -> None:
    for i in range(20):
        write(f"memory/n{i}.md", f"# N{i}\nnote {i}")
    index = MemoryIndex(settings)
    index.sync()
    report = index.sync()
    assert report.unchanged == 20 and not report.changed and report.bytes_read == 0


def test_many_files_take_the_parallel_path_and_give_the_same_index(settings: Settings, write, monkeypatch) -> None:
    import clawmem.sync as sync_module

    for i in range(80):
        write(f"memory/n{i:03}.md", f"# Note {i}\n" + f"- fact {i} about topic{i % 7}\n" * 20)
    monkeypatch.setattr(sync_module, "PARALLEL_MIN_BYTES", 1)
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 80
    parallel = sorted(index.reader().execute("SELECT path, start_line, end_line, hash FROM chunks"))
    index.close()
    monkeypatch.setattr(sync_module, "PARALLEL_MIN_BYTES", 1 << 60)
    index.reindex()
    serial = sorted(index.reader().execute("SELECT path, start_line, end_line, hash FROM chunks"))
    assert parallel == serial and len(parallel) >= 80


def test_a_targeted_sync_touches_only_the_named_paths(settings: Settings, write, workspace: Path) -> None:
    write("memory/a.md", "# A\nalpha")
    write("memory/b.md", "# B\nbravo")
    index = MemoryIndex(settings)
    index.sync()
    write("memory/a.md", "# A\nalpha amended with zucchini")
    write("memory/b.md", "# B\nbravo amended with yam")
    write("memory/new.md", "# N\nnew parsnip")
    (workspace / "memory" / "gone.md").write_text("# G\n")
    report = index.sync(paths=["memory/a.md", "memory/new.md", "memory/never-existed.md"])
    assert (report.added, report.updated, report.removed) == (1, 1, 0)
    assert paths_found(index, "zucchini") == {"memory/a.md"}
    assert paths_found(index, "parsnip") == {"memory/new.md"}
    assert paths_found(index, "yam") == set(), "b.md was not named, so not read"
    (workspace / "memory" / "a.md").unlink()
    report = index.sync(paths=["memory/a.md"])
    assert report.removed == 1 and paths_found(index, "zucchini") == set()


def test_a_targeted_sync_ignores_paths_that_are_not_memory(settings: Settings, write, workspace: Path,
                                                          tmp_path: Path) -> None:
    write("notes.md", "# not memory\nturnip")
    outside = tmp_path / "outside.md"
    outside.write_text("# O\nturnip")
    os.symlink(outside, workspace / "memory" / "link.md")
    index = MemoryIndex(settings)
    index.sync(paths=["notes.md", "memory/link.md", "../outside.md"])
    assert paths_found(index, "turnip") == set()
