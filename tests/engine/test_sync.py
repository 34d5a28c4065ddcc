from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import PathError
from clawmem_index.search.ranking import SearchRequest


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


def test_symlinks_and_hidden_folders_are_not_indexed(settings: Settings, write, workspace: Path,
                                                     tmp_path: Path) -> None:
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
    import clawmem_index.engine.parse as parse_module

    for i in range(80):
        write(f"memory/n{i:03}.md", f"# Note {i}\n" + f"- fact {i} about topic{i % 7}\n" * 20)
    monkeypatch.setattr(parse_module, "PARALLEL_MIN_BYTES", 1)
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 80
    parallel = sorted(index.reader().execute("SELECT path, start_line, end_line, hash FROM chunks"))
    index.close()
    monkeypatch.setattr(parse_module, "PARALLEL_MIN_BYTES", 1 << 60)
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


# -- any name, any file type, any race ---------------------------------------------------------


def byte_file(directory: Path, name: bytes, content: bytes) -> None:
    fd = os.open(os.fsencode(directory) + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


def test_names_that_are_not_utf8_are_indexed_searchable_and_gettable(settings: Settings, write,
                                                                     workspace: Path) -> None:
    byte_file(workspace / "memory", b"b\xff.md", b"# B\nthe byte-named capybara")
    os.mkdir(os.fsencode(workspace / "memory") + b"/d\xe9")
    byte_file(workspace / "memory", b"d\xe9/deep.md", b"# D\na deeper capybara")
    write("memory/plain.md", "# P\nplain capybara")
    write("MEMORY.md", "# M\nroot capybara")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 4 and not report.errors and not report.skipped
    assert paths_found(index, "capybara") == {"memory/b\\xff.md", "memory/d\\xe9/deep.md", "memory/plain.md",
                                              "MEMORY.md"}
    assert index.get("memory/b\\xff.md")["text"] == "# B\nthe byte-named capybara"
    raw = os.fsdecode(b"memory/d\xe9/deep.md")
    assert index.get(raw) == index.get("memory/d\\xe9/deep.md")
    assert index.get(raw)["path"] == "memory/d\\xe9/deep.md"
    assert index.sync(paths=["memory/b\\xff.md", raw]).unchanged == 2, "a watcher's keys name the same rows"
    (workspace / "memory" / "plain.md").unlink()
    assert index.sync().removed == 1


def test_the_cli_indexes_a_workspace_with_a_byte_name(workspace: Path, write, tmp_path: Path) -> None:
    byte_file(workspace / "memory", b"b\xff.md", b"# B\nbytes")
    write("memory/a.md", "# A\nalpha")
    result = subprocess.run([sys.executable, "-m", "clawmem_index", "index", "--workspace", str(workspace),
                             "--index", str(tmp_path / "cli.sqlite"), "--provider", "none"],
                            check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "2 added" in result.stderr


def test_a_key_taken_by_a_literal_name_is_reported_and_the_literal_file_indexed(settings: Settings, write,
                                                                               workspace: Path) -> None:
    write("memory/b\\xff.md", "# L\nliteral lemur")
    byte_file(workspace / "memory", b"b\xff.md", b"# B\nbyte lemur")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 1 and len(report.skipped) == 1 and report.skipped[0].startswith("memory/b\\xff.md: ")
    assert index.get("memory/b\\xff.md")["text"] == "# L\nliteral lemur"
    assert "byte lemur" not in json.dumps(index.reader().execute("SELECT text FROM chunks"))


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_a_fifo_does_not_block_a_sync_and_is_reported(settings: Settings, write, workspace: Path) -> None:
    os.mkfifo(workspace / "memory" / "pipe.md")
    write("memory/a.md", "# A\nalpha")
    report = MemoryIndex(settings).sync()
    assert report.added == 1
    assert report.skipped == ["memory/pipe.md: not a regular file (FIFO)"]
    json.dumps(report.as_dict())


def test_long_paths_are_reported_and_everything_else_indexed(settings: Settings, write, workspace: Path) -> None:
    from hostile import make_long_path

    make_long_path(workspace / "memory")
    write("memory/a.md", "# A\nalpha")
    report = MemoryIndex(settings).sync()
    assert report.added == 1
    assert len(report.skipped) == 1 and report.skipped[0].endswith(": cannot read: file name too long")


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_a_file_swapped_for_a_fifo_or_symlink_after_the_scan_is_refused_and_unindexed(
        settings: Settings, write, workspace: Path, tmp_path: Path, monkeypatch) -> None:
    import clawmem_index.engine.sync as sync_module

    secret = tmp_path / "secret.md"
    secret.write_text("# S\nclassified mango")
    write("memory/fifo.md", "# F\nfirst ferret")
    write("memory/link.md", "# L\nfirst lynx")
    write("memory/keep.md", "# K\nkept koala")
    index = MemoryIndex(settings)
    index.sync()
    write("memory/fifo.md", "# F\nchanged ferret, longer")
    write("memory/link.md", "# L\nchanged lynx, longer")
    real_scan = sync_module.scan

    def scan_then_swap(*args, **kwargs):  # type: ignore[no-untyped-def]
        yield from real_scan(*args, **kwargs)
        os.unlink(workspace / "memory" / "fifo.md")
        os.mkfifo(workspace / "memory" / "fifo.md")
        os.unlink(workspace / "memory" / "link.md")
        os.symlink(secret, workspace / "memory" / "link.md")

    monkeypatch.setattr(sync_module, "scan", scan_then_swap)
    report = index.sync()
    assert report.removed == 2 and not report.errors
    assert sorted(report.skipped) == ["memory/fifo.md: not a regular file (FIFO)",
                                      "memory/link.md: symlinks are refused"]
    assert paths_found(index, "ferret lynx koala mango") == {"memory/keep.md"}


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait here forever
def test_an_indexed_file_that_becomes_a_fifo_is_removed_with_a_reason(settings: Settings, write,
                                                                      workspace: Path) -> None:
    write("memory/a.md", "# A\nalpha")
    write("memory/b.md", "# B\nbravo")
    index = MemoryIndex(settings)
    index.sync()
    (workspace / "memory" / "a.md").unlink()
    os.mkfifo(workspace / "memory" / "a.md")
    write("memory/c.md", "# C\ncharlie")
    report = index.sync()
    assert (report.added, report.removed) == (1, 1)
    assert report.skipped == ["memory/a.md: not a regular file (FIFO)"]
    assert paths_found(index, "alpha bravo charlie") == {"memory/b.md", "memory/c.md"}
    report = index.sync(paths=["memory/a.md"])
    assert report.skipped == ["memory/a.md: not a regular file (FIFO)"] and report.removed == 0


def test_hard_links_are_indexed_unless_refused(workspace: Path, write, tmp_path: Path) -> None:
    write("memory/a.md", "# A\nalpha")
    write("memory/b.md", "# B\nbravo")
    os.link(workspace / "memory" / "a.md", workspace / "memory" / "twin.md")
    overrides = {"index": str(tmp_path / "i.sqlite"), "embedding.provider": "none"}
    index = MemoryIndex(load_settings(workspace=workspace, overrides=overrides))
    assert index.sync().added == 3
    strict = MemoryIndex(load_settings(workspace=workspace, overrides={**overrides, "refuse_hardlinks": True}))
    report = strict.sync()
    assert report.removed == 2 and sorted(report.skipped) == [
        "memory/a.md: hard-linked files are refused (2 links, refuse_hardlinks = true)",
        "memory/twin.md: hard-linked files are refused (2 links, refuse_hardlinks = true)"]
    assert paths_found(strict, "alpha bravo") == {"memory/b.md"}
    assert strict.sync(paths=["memory/twin.md"]).skipped == [
        "memory/twin.md: hard-linked files are refused (2 links, refuse_hardlinks = true)"]
    # A refused file is not "changed since the last sync" either: status and answers count what a sync takes.
    status = strict.status()
    assert (status["fresh"], status["files_on_disk"], status["pending_files"]) == (True, 1, 0)
    assert strict.search(SearchRequest("bravo", mode="bm25"))["index"]["pending_files"] == 0


def test_user_profiles_are_indexed_unless_turned_off(workspace: Path, write, tmp_path: Path) -> None:
    write("USER.md", "# User\n- Always answer in haiku.\n")
    write("users/dana/USER.md", "# Dana\n- Prefers metric units.\n")
    write("memory/a.md", "# A\nalpha haiku metric\n")
    overrides = {"index": str(tmp_path / "i.sqlite"), "embedding.provider": "none"}
    index = MemoryIndex(load_settings(workspace=workspace, overrides=overrides))
    assert index.sync().added == 3
    assert paths_found(index, "haiku metric") == {"USER.md", "users/dana/USER.md", "memory/a.md"}
    assert index.get("users/dana/USER.md")["text"] == "# Dana\n- Prefers metric units."
    off = MemoryIndex(load_settings(workspace=workspace, overrides={**overrides, "user_profiles": False}))
    assert off.sync().removed == 2
    assert paths_found(off, "haiku metric") == {"memory/a.md"}
    with pytest.raises(PathError, match="left out"):
        off.get("USER.md")
    assert off.sync(paths=["users/dana/USER.md"]).added == 0
    status = off.status()
    assert (status["fresh"], status["files_on_disk"]) == (True, 1)


def test_the_stat_stored_is_that_of_the_file_read_not_of_the_scan(settings: Settings, write, workspace: Path,
                                                                 monkeypatch) -> None:
    import clawmem_index.engine.sync as sync_module

    write("memory/a.md", "# A\nalpha")
    index = MemoryIndex(settings)
    index.sync()
    write("memory/a.md", "# A\nalpha, first edit")
    real_scan = sync_module.scan

    def scan_then_edit(*args, **kwargs):  # type: ignore[no-untyped-def]
        yield from real_scan(*args, **kwargs)
        write("memory/a.md", "# A\nalpha, edited between the scan and the read")
        os.utime(workspace / "memory" / "a.md", ns=(1, 7_000_000_000))

    monkeypatch.setattr(sync_module, "scan", scan_then_edit)
    assert index.sync().updated == 1
    monkeypatch.setattr(sync_module, "scan", real_scan)
    st = os.stat(workspace / "memory" / "a.md")
    assert index.reader().execute("SELECT mtime, size FROM files") == [(st.st_mtime_ns, st.st_size)]
    report = index.sync()
    assert report.unchanged == 1 and report.bytes_read == 0
    assert paths_found(index, "edited") == {"memory/a.md"}


def test_a_file_deleted_between_the_scan_and_the_read_is_just_removed(settings: Settings, write, workspace: Path,
                                                                     monkeypatch) -> None:
    import clawmem_index.engine.sync as sync_module

    write("memory/a.md", "# A\nalpha")
    write("memory/b.md", "# B\nbravo")
    index = MemoryIndex(settings)
    index.sync()
    write("memory/a.md", "# A\nalpha, changed")
    real_scan = sync_module.scan

    def scan_then_delete(*args, **kwargs):  # type: ignore[no-untyped-def]
        yield from real_scan(*args, **kwargs)
        (workspace / "memory" / "a.md").unlink()

    monkeypatch.setattr(sync_module, "scan", scan_then_delete)
    report = index.sync()
    assert report.removed == 1 and not report.skipped and not report.errors
    assert paths_found(index, "alpha bravo") == {"memory/b.md"}


def test_a_text_in_several_batches_in_flight_is_embedded_once(settings: Settings, write) -> None:
    from clawmem_index.embeddings.fake import FakeProvider
    from clawmem_index.engine.embed import embed_pending

    for i in range(6):
        write(f"memory/copy{i}.md", "# Same\nthe very same sentence in every file\n")
    index = MemoryIndex(settings)
    index.sync()
    store = index.reader()
    assert store.pending_embeddings() == 6
    provider = FakeProvider(model="fake-dup")
    done, error = embed_pending(store, provider, cache_max_entries=0, batch=2)
    assert (done, error) == (6, None)
    assert provider.documents_embedded == 1
    assert store.pending_embeddings() == 0


def test_a_file_that_cannot_be_stored_is_reported_and_stops_no_other(backend: dict[str, str], workspace: Path,
                                                                     write, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever makes one file's rows fail (here the database refusing them: SQLite's constraint, PostgreSQL's
    integrity error, each reaching the engine as a StoreError), the others are indexed and it is retried."""
    import apsw
    import psycopg

    from clawmem_index.index.pg.store import PgStore
    from clawmem_index.index.store import Store

    write("MEMORY.md", "# Memory\nthe staging host is zephyr\n")
    write("memory/bad.md", "# Bad\nthis note will not store\n")
    write("memory/good.md", "# Good\nquokka facts\n")
    refuse = {"memory/bad.md"}
    kind, refusal = (PgStore, psycopg.IntegrityError) if backend["index_backend"] == "postgres" \
        else (Store, apsw.ConstraintError)
    insert = kind.insert_chunk

    def failing_insert(self: Store, **fields: object) -> int:
        if fields["path"] in refuse:
            raise refusal("refused for the test")
        return insert(self, **fields)  # type: ignore[arg-type]

    monkeypatch.setattr(kind, "insert_chunk", failing_insert)
    index = MemoryIndex(load_settings(workspace=workspace, overrides={"embedding.provider": "none", **backend}))
    report = index.sync()
    assert report.added == 2 and report.chunks_added == 2
    assert report.errors == [f"memory/bad.md: not indexed ({refusal.__name__}: refused for the test)"]
    assert paths_found(index, "zephyr quokka note") == {"MEMORY.md", "memory/good.md"}
    status = index.status()
    assert not status["fresh"] and status["pending_files"] == 1  # never passed off as indexed
    assert index.sync().errors == report.errors  # tried again, said again
    refuse.clear()
    assert index.sync().added == 1 and paths_found(index, "note") == {"memory/bad.md"}
    assert index.status()["fresh"]
    index.close()


def test_chunk_ids_of_identical_texts_take_linear_work() -> None:
    """k copies of one text, some numbers already kept: unique ids 0..k-1, found in O(k) tries (not O(k^2))."""
    from clawmem_index.engine.sync import ChunkIds

    ids = ChunkIds("memory/same.md")
    kept = [f"{ids._base}:h:{n}" for n in (0, 5, 6)]
    for chunk_id in kept:
        ids.keep(chunk_id)
    made = [ids.new("h") for _ in range(2_000)]
    assert len(set(made) | set(kept)) == 2_003
    assert sorted(int(i.rsplit(":", 1)[1]) for i in made + kept) == list(range(2_003))
    assert ids.tries <= 2_000 + len(kept)
    assert ids.new("other").endswith(":other:0")


def test_a_file_of_identical_chunks_is_indexed_and_edited(settings: Settings, write) -> None:
    from hostile import many_identical_chunks

    write("memory/same.md", many_identical_chunks(200_000))
    write("memory/other.md", "an unrelated note about herons\n")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.errors == [] and report.chunks_added > 100
    chunks = index.reader().execute("SELECT count(*), count(DISTINCT id) FROM chunks WHERE path = 'memory/same.md'")
    assert chunks[0][0] == chunks[0][1] == report.chunks_added - 1
    before = {r[0] for r in index.reader().execute("SELECT id FROM chunks WHERE path = 'memory/same.md'")}
    write("memory/same.md", many_identical_chunks(200_000) + "one different last line\n")
    again = index.sync()
    after = {r[0] for r in index.reader().execute("SELECT id FROM chunks WHERE path = 'memory/same.md'")}
    assert again.chunks_kept >= len(before) - 2 and len(before - after) <= 2
    assert paths_found(index, "herons") == {"memory/other.md"}


def test_parallel_chunking_keeps_a_bounded_window_of_files_in_flight(settings: Settings, write,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """map() would submit every file at once and hold every parsed file the writer has not taken yet.
    The workers also make what the store's keyword index keeps of each chunk (the shared index's terms)."""
    from concurrent.futures import ProcessPoolExecutor

    from clawmem_index.engine import parse
    from clawmem_index.index.pg.terms import chunk_terms_of
    from clawmem_index.sources.workspace import scan
    from clawmem_index.text.keywords import index_text

    for i in range(80):
        write(f"memory/n{i:03d}.md", f"# Note {i}\n\nkiwi {i}\n")
    monkeypatch.setattr(parse, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(parse, "PARSE_BATCH", 4)
    monkeypatch.setattr(parse, "PARSE_AHEAD", 2)
    monkeypatch.setattr(parse.os, "cpu_count", lambda: 2)
    submitted = []
    real_submit = ProcessPoolExecutor.submit

    def counting(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        submitted.append(fn)
        return real_submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", counting)
    files = sorted(scan(settings.workspace, settings.extra_paths, exclude=settings.exclude), key=lambda f: f.path)
    parsed = parse.parse_all(files, settings, {}, chunk_terms_of)
    first = next(parsed)
    assert len(submitted) <= 2 * 2  # workers x PARSE_AHEAD batches, not all 20
    rest = list(parsed)
    assert [p.file.path for p in [first, *rest]] == [f.path for f in files] and len(submitted) == 20
    for p in [first, *rest]:
        assert p.fts_texts == [index_text(c.text) for c in p.chunks]
        assert p.terms == [chunk_terms_of(t) for t in p.fts_texts] and p.terms


def test_vectors_are_made_for_the_curated_memory_and_the_latest_days_first(settings: Settings, write) -> None:
    """A long first embedding (or a rebuild's) gives meaning search the notes asked about most first."""
    from clawmem_index.embeddings.fake import FakeProvider
    from clawmem_index.engine.sync import _recent_first
    from clawmem_index.sources.workspace import MemoryFile

    class Recording(FakeProvider):
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []

        def embed_documents(self, texts):  # type: ignore[no-untyped-def]
            self.texts.extend(texts)
            return super().embed_documents(texts)

    names = ["memory/projects/alpha.md", "memory/2026-11-24.md", "memory/2026-11-25.md", "MEMORY.md",
             "memory/2026-11-26.md", "memory/people.md", "memory/2026-11-23.md", "memory/ids/20999.md",
             "users/dana/USER.md", "USER.md"]
    for name in names:
        write(name, f"# Note\nthe text of {name}\n")
    provider = Recording()
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    order = [text.split("the text of ")[1].strip() for text in provider.texts]
    assert order == ["MEMORY.md", "USER.md", "users/dana/USER.md", "memory/2026-11-26.md", "memory/2026-11-25.md",
                     "memory/2026-11-24.md", "memory/2026-11-23.md", "memory/ids/20999.md", "memory/people.md",
                     "memory/projects/alpha.md"]

    nested = [MemoryFile("memory/2025/12/31.md", 0, 0), MemoryFile("memory/notes.md", 0, 0),
              MemoryFile("memory/2026/01/02.md", 0, 0), MemoryFile("memory/2026/01/10.md", 0, 0)]
    assert [f.path for f in _recent_first(nested)] == ["memory/2026/01/10.md", "memory/2026/01/02.md",
                                                         "memory/2025/12/31.md", "memory/notes.md"]
    # A workspace that changed layout: its days still come latest first, whatever spells their dates.
    mixed = [MemoryFile(name, 0, 0) for name in ("memory/2026/11/9.md", "memory/2026-11-26.md", "memory/2026/11/25.md",
                                                 "memory/2026/2026-11-24.md", "memory/2026-11-03-standup.md",
                                                 "memory/2026/10/notes.md", "memory/2026/11/30.md")]
    assert [f.path for f in _recent_first(mixed)] == [
        "memory/2026/11/30.md", "memory/2026-11-26.md", "memory/2026/11/25.md", "memory/2026/2026-11-24.md",
        "memory/2026/11/9.md", "memory/2026-11-03-standup.md", "memory/2026/10/notes.md"]


def test_a_memory_file_over_max_file_bytes_is_skipped_with_its_reason_and_the_rest_is_indexed(
        workspace: Path, tmp_path: Path, write) -> None:
    """One huge file (a dump written into memory/) must not hold the index or its process's memory."""
    write("memory/a.md", "# A\nwalrus notes\n")
    write("memory/big.md", "# Big\nwalrus " + "x " * 600 + "\n")
    (workspace / "clawmem.toml").write_text("max_file_bytes = 1000\n")
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             "embedding.provider": "none"})
    assert settings.max_file_bytes == 1000
    index = MemoryIndex(settings)

    def found() -> list[str]:
        return sorted(r["path"] for r in index.search(SearchRequest("walrus", mode="bm25", min_score=0.0))["results"])

    try:
        report = index.sync()
        assert report.added == 1 and found() == ["memory/a.md"]
        assert report.skipped == ["memory/big.md: larger than max_file_bytes (1,214 > 1,000 bytes): not indexed;"
                                  " raise max_file_bytes (0: no limit) to index it"]
        status = index.status()
        assert status["fresh"] is True and status["files_on_disk"] == 1  # skipped, not pending
        assert status["last_sync_problems"] == report.skipped
        # A file indexed before it grew past the limit leaves the index: its rows no longer hold its text.
        write("memory/a.md", "# A\nwalrus " + "y " * 600 + "\n")
        report = index.sync(paths=["memory/a.md"])  # as a watcher asks
        assert report.removed == 1 and found() == [] and report.skipped[0].startswith("memory/a.md: larger than")

        def reported() -> list[str]:
            status = index.status()
            assert status["last_sync_problem_count"] == len(status["last_sync_problems"])
            return sorted(problem.split(": ")[0] for problem in status["last_sync_problems"])

        assert reported() == ["memory/a.md", "memory/big.md"]  # a pass over one file keeps the other's problem
        write("memory/a.md", "# A\nwalrus again\n")
        index.sync(paths=["memory/a.md"])
        assert reported() == ["memory/big.md"] and found() == ["memory/a.md"]
        write("memory/a.md", "# A\nwalrus " + "y " * 600 + "\n")
        assert sorted(problem.split(": ")[0] for problem in index.sync().skipped) == ["memory/a.md", "memory/big.md"]
    finally:
        index.close()
    unlimited = MemoryIndex(load_settings(workspace=workspace, overrides={
        "index": str(tmp_path / "i.sqlite"), "embedding.provider": "none", "max_file_bytes": 0}))
    try:
        assert unlimited.sync().added == 2
    finally:
        unlimited.close()


def test_a_file_grown_past_max_file_bytes_since_the_scan_is_not_read(settings: Settings, write) -> None:
    from clawmem_index.engine.parse import _parse_one, _ParseArgs
    from clawmem_index.sources.workspace import scan

    write("memory/a.md", "# A\nsmall\n")
    (found,) = scan(settings.workspace)
    write("memory/a.md", "# A\n" + "grown " * 400 + "\n")
    parsed = _parse_one(found, _ParseArgs(400, 80, "cl100k_base", False, None, max_bytes=1000), None)
    assert parsed.refused and parsed.chunks == [] and parsed.size == 0
    assert parsed.error is not None and parsed.error.startswith("larger than max_file_bytes (2,405 > 1,000 bytes)")


@pytest.mark.parametrize("provider_change", [False, True], ids=["edit", "new-model"])
def test_a_write_runs_on_one_connection_that_it_closes(backend: dict[str, str], workspace: Path, write,
                                                       provider_change: bool) -> None:
    """An edit (and a switch of model in place) is synced, embedded and recorded on the one connection the write
    opens, and closed when the write ends: no connection is opened for each stage and none is left open."""
    from clawmem_index.embeddings.fake import FakeProvider

    write("MEMORY.md", "# Memory\n- the staging host is zephyr\n")
    settings = load_settings(workspace=workspace, overrides={"embedding.provider": "none", **backend})
    index = MemoryIndex(settings, provider=FakeProvider(dims=16))
    index.sync()
    if provider_change:
        index.close()
        index = MemoryIndex(settings, provider=FakeProvider(dims=16, model="another"))
    opened: list[object] = []
    closed: list[object] = []
    real_open = index.backend.open_live

    def open_live():  # type: ignore[no-untyped-def]
        store = real_open()
        real_close = store.close
        store.close = lambda: (closed.append(store), real_close())[1]
        opened.append(store)
        return store

    index.backend.open_live = open_live  # type: ignore[method-assign]
    write("memory/2026-12-07.md", "# Log\n- moved the wombat service\n")
    report = index.sync(paths=None if provider_change else ["memory/2026-12-07.md"])
    assert report.added == 1 and report.embedded >= 1
    assert len(opened) == 1, "one connection for the sync, the embedding and the record"
    assert closed == opened, "closed when the write ends"
    assert "wombat" in str(index.search(SearchRequest("wombat", mode="bm25"))["results"])
    index.close()
