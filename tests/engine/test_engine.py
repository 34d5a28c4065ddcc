from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import apsw
import pytest
from daemon_helpers import wait_until

from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import IndexBusy, IndexUnavailable, PathError, QueryError
from clawmem_index.index.store import Store
from clawmem_index.search.ranking import SearchRequest

CHILD = """
import sys
from clawmem_index.config import load_settings
from clawmem_index.engine.core import MemoryIndex
settings = load_settings(workspace=sys.argv[1], overrides={"index": sys.argv[2], "embedding.provider": "none",
                                                           "chunking.tokens": int(sys.argv[3])})
def progress(done, total):
    print(done, flush=True)
index = MemoryIndex(settings)
(index.reindex if sys.argv[4] == "reindex" else index.sync)(progress=progress)
print("done", flush=True)
"""


def make_notes(write, n: int, tag: str = "") -> None:
    for i in range(n):
        write(f"memory/day{i:04}.md", f"# Day {i}\n" + "".join(f"- item {j} of day {i} {tag}\n" for j in range(30)))


def run_and_kill(workspace: Path, index_path: Path, tokens: int, mode: str, kill_after: int) -> bool:
    """Run a sync in a child process and SIGKILL it after `kill_after` progress lines; True if it was killed."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(workspace), str(index_path), str(tokens), mode],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        if line.strip() == "done":
            break
        seen += 1
        if seen >= kill_after:
            proc.send_signal(signal.SIGKILL)
            break
    proc.stdout.close()
    proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def integrity_ok(path: Path) -> bool:
    store = Store(path, create=False)
    try:
        return store.integrity_ok()
    finally:
        store.close()


def no_strays(index_path: Path) -> bool:
    return not list(index_path.parent.glob(f"{index_path.name}.rebuild-*"))


@pytest.mark.slow
def test_a_sync_killed_at_random_points_always_leaves_a_consistent_index(settings: Settings, write,
                                                                         workspace: Path) -> None:
    make_notes(write, 150)
    index = MemoryIndex(settings)
    index.sync()
    index.close()
    rng = random.Random(1234)
    killed = 0
    for round_no in range(12):
        make_notes(write, 150, tag=f"round{round_no}")
        killed += run_and_kill(workspace, settings.index_path, 400, "sync", rng.randint(1, 150))
        assert integrity_ok(settings.index_path)
        store = Store(settings.index_path, create=False)
        assert store.counts()[0] == 150
        store.close()
    assert killed >= 6, "the child must really have been killed mid-sync most of the time"
    index = MemoryIndex(settings)
    index.sync()
    assert index.status()["pending_files"] == 0
    # converged: every file's chunks reflect the last round
    assert index.reader().execute("SELECT count(DISTINCT path) FROM chunks WHERE text LIKE '%round11%'") == [(150,)]
    ranked = index.search(SearchRequest("round11", max_results=200, min_score=0.0, mode="bm25"))["results"]
    assert len({r["path"] for r in ranked}) == 150  # type: ignore[union-attr, index]


@pytest.mark.slow
def test_a_killed_rebuild_leaves_the_old_index_serving_and_no_stray_files(settings: Settings, write,
                                                                         workspace: Path) -> None:
    make_notes(write, 300)
    index = MemoryIndex(settings)
    index.sync()
    old_fingerprint = index.reader().meta.get("fingerprint")
    old_rows = index.reader().execute("SELECT count(*) FROM chunks")
    index.close()
    rng = random.Random(99)
    for _ in range(5):
        # chunk size 100 differs from the index's 400: the child rebuilds into a private file
        assert run_and_kill(workspace, settings.index_path, 100, "sync", rng.randint(1, 250))
        assert integrity_ok(settings.index_path)
        store = Store(settings.index_path, create=False)
        assert store.meta.get("fingerprint") == old_fingerprint
        assert store.execute("SELECT count(*) FROM chunks") == old_rows
        store.close()
        answer = MemoryIndex(settings).search(SearchRequest("day 17 item", mode="bm25"))
        assert answer["results"]
    assert not no_strays(settings.index_path), "a killed rebuild leaves its private file until the next writer"
    MemoryIndex(settings).sync()
    assert no_strays(settings.index_path)


def test_changing_chunk_size_or_tokenizer_rebuilds_the_index(settings: Settings, write, workspace: Path,
                                                            tmp_path: Path) -> None:
    write("memory/a.md", "# A\n" + "- a fact about the garden\n" * 200)
    index = MemoryIndex(settings)
    index.sync()
    before = index.reader().counts()[1]
    fp_before = json.loads(index.reader().meta.get("fingerprint") or "{}")

    smaller = load_settings(workspace=workspace, overrides={"index": str(settings.index_path),
                                                            "embedding.provider": "none", "chunking.tokens": 100})
    report = MemoryIndex(smaller).sync()
    assert report.added == 1
    store = Store(settings.index_path, create=False)
    request_close = store.close
    assert store.counts()[1] > before
    assert json.loads(store.meta.get("fingerprint") or "{}")["chunk_tokens"] == 100

    other_tok = load_settings(workspace=workspace, overrides={"index": str(settings.index_path),
                                                             "embedding.provider": "none", "chunking.tokens": 100,
                                                             "chunking.tokenizer": "o200k_base"})
    MemoryIndex(other_tok).sync()
    assert json.loads(store.meta.get("fingerprint") or "{}")["tokenizer"] == "o200k_base"
    assert fp_before["tokenizer"] == "cl100k_base"
    request_close()


def test_same_fingerprint_does_not_rebuild(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nalpha")
    index = MemoryIndex(settings)
    index.sync()
    seqs = index.reader().execute("SELECT seq FROM chunks")
    index.sync()
    assert index.reader().execute("SELECT seq FROM chunks") == seqs


def test_a_reader_open_during_a_rebuild_sees_the_new_index_afterwards(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nalpha")
    index = MemoryIndex(settings)
    index.sync()
    reader = index.reader()
    write("memory/b.md", "# B\nbravo")
    index.reindex()
    assert sorted(p for (p,) in reader.execute("SELECT path FROM files")) == ["memory/a.md", "memory/b.md"]


def test_a_corrupt_index_file_is_rebuilt(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nalpha")
    settings.index_path.parent.mkdir(parents=True, exist_ok=True)
    settings.index_path.write_bytes(b"this is not a database" * 100)
    index = MemoryIndex(settings)
    index.sync()
    assert index.search(SearchRequest("alpha", mode="bm25"))["results"]


def test_a_reindex_over_an_index_whose_vectors_are_damaged_embeds_them_again(settings: Settings, write) -> None:
    """The old file's vectors are carried if they can be read; damaged, they are made again, never the rebuild's end."""
    from clawmem_index.embeddings.fake import FakeProvider

    for i in range(40):
        write(f"memory/n{i}.md", f"# Note {i}\nthe greenhouse fact number {i}\n")
    provider = FakeProvider(dims=256)
    MemoryIndex(settings, provider=provider).sync()
    store = Store(settings.index_path, create=False)
    pages = [int(n)
             for (n,) in store.execute("SELECT pageno FROM dbstat WHERE name = 'chunks_vec' AND pagetype = 'leaf'")]
    size = int(store.execute("PRAGMA page_size")[0][0])
    store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    with settings.index_path.open("r+b") as f:
        for page in pages:
            f.seek((page - 1) * size)
            f.write(b"\0" * 8)  # each leaf of the vector table loses its header: reading a vector is an error
    before = provider.documents_embedded
    index = MemoryIndex(settings, provider=provider)
    report = index.reindex()
    assert index.status()["pending_embeddings"] == 0 and provider.documents_embedded - before == 40
    assert report.from_cache == 0
    hits = index.search(SearchRequest("greenhouse fact number 7", mode="vector", min_score=0.0))["results"]
    assert hits and hits[0]["path"] == "memory/n7.md"
    index.close()


def test_searching_before_any_index_is_a_clear_error(settings: Settings) -> None:
    with pytest.raises(IndexUnavailable, match="clawmem index"):
        MemoryIndex(settings).search(SearchRequest("x"))


def test_only_one_writer_at_a_time(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nalpha")
    first = MemoryIndex(settings)
    second = MemoryIndex(settings, lock_timeout=0.2)
    with first.write_lock(), pytest.raises(IndexBusy):
        second.sync()


def test_get_returns_line_ranges_and_refuses_bad_values(settings: Settings, write) -> None:
    write("memory/a.md", "l1\nl2\nl3\nl4\n")
    index = MemoryIndex(settings)
    assert index.get("memory/a.md") == {"path": "memory/a.md", "text": "l1\nl2\nl3\nl4", "from": 1, "lines": 4,
                                        "truncated": False}
    assert index.get("memory/a.md", 2, 2)["text"] == "l2\nl3"
    assert index.get("memory/a.md", 9)["text"] == ""
    assert index.get("memory/a.md", 9)["file_lines"] == 4  # past the end: the answer says how far the file goes
    assert index.get("memory/a.md", 5)["file_lines"] == 4
    assert "file_lines" not in index.get("memory/a.md", 4)
    write("memory/b.md", "l1\nl2 without its newline")
    assert index.get("memory/b.md", 3)["file_lines"] == 2
    with pytest.raises(QueryError):
        index.get("memory/a.md", 0)
    with pytest.raises(PathError):
        index.get("../a.md")


def test_status_reports_counts_and_freshness(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nalpha")
    index = MemoryIndex(settings)
    assert index.status()["index_exists"] is False
    index.sync()
    status = index.status()
    assert status["files_on_disk"] == status["files_indexed"] == 1
    assert status["fresh"] is True and status["sqlite_vec_loaded"] is True
    write("memory/b.md", "# B\nbravo")
    status = index.status()
    assert status["pending_files"] == 1 and status["fresh"] is False
    os.remove(settings.workspace / "memory" / "a.md")
    assert index.status()["pending_files"] == 2


def test_a_query_without_a_watcher_counts_pending_files_within_a_bound(settings: Settings, write,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact when the check finishes in time (changes, additions and deletions); a lower bound, said so, when not."""
    import clawmem_index.engine.status as status_module

    for i in range(40):
        write(f"memory/n{i:02}.md", f"note {i} about tomatoes\n")
    index = MemoryIndex(settings)
    index.sync()
    assert index.search(SearchRequest("tomatoes"))["index"] == {"pending_files": 0, "pending_embeddings": 0}
    for i in range(10):
        write(f"memory/n{i:02}.md", f"note {i} about tomatoes, edited at more length\n")
    write("memory/new.md", "a new note\n")
    (settings.workspace / "memory" / "n39.md").unlink()
    assert index.search(SearchRequest("tomatoes"))["index"]["pending_files"] == 12

    monkeypatch.setattr(status_module, "PENDING_CHECK_SECONDS", 0.0)
    counted = index.search(SearchRequest("tomatoes"))["index"]
    assert counted["pending_files_complete"] is False
    assert 0 <= counted["pending_files"] <= 12
    assert index.status()["pending_files"] == 12  # status always counts them all


def test_a_pending_check_that_reaches_the_last_file_is_exact_however_long_it_took(
        settings: Settings, write, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine can pass the deadline while checking the last file: the count is still whole."""
    import clawmem_index.engine.status as status_module

    write("memory/only.md", "the one note about tomatoes\n")
    index = MemoryIndex(settings)
    index.sync()
    write("memory/only.md", "the one note about tomatoes, edited\n")
    monkeypatch.setattr(status_module, "PENDING_CHECK_SECONDS", 0.0)
    assert index.search(SearchRequest("tomatoes"))["index"] == {"pending_files": 1, "pending_embeddings": 0}


def test_a_querys_pending_check_runs_beside_the_search_on_a_connection_it_closes(settings: Settings, write,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """While FTS5 ranks (C code that lets go of the interpreter) the check runs on the other core:
    on a thread of its own, through its own connection, closed when done; what it raises, the search
    raises. An answer the query cache holds has no search to run beside, so it checks in place."""
    import clawmem_index.engine.status as status_module

    for i in range(5):
        write(f"memory/n{i}.md", f"note {i} about tomatoes\n")
    index = MemoryIndex(settings)
    index.sync()
    reader = index.reader()
    seen: list[tuple[str, bool]] = []
    check = status_module.Freshness.query_pending_files

    def watched(self: status_module.Freshness, store: Store) -> dict[str, object]:
        seen.append((threading.current_thread().name, store is reader))
        return check(self, store)

    monkeypatch.setattr(status_module.Freshness, "query_pending_files", watched)

    def open_here() -> int:  # this index's connections (another test's, collected meanwhile, do not count)
        return sum(1 for conn in apsw.connections() if Path(conn.filename) == settings.index_path)

    open_before = open_here()
    write("memory/n0.md", "note 0 about tomatoes, edited\n")
    assert index.search(SearchRequest("tomatoes", mode="bm25"))["index"]["pending_files"] == 1
    assert seen == [("clawmem-pending-check", False)]
    assert open_here() == open_before
    assert index.search(SearchRequest("tomatoes", mode="bm25"))["index"]["pending_files"] == 1  # the cached answer
    assert seen[1:] == [(threading.current_thread().name, True)]

    def broken(*args: object, **kwargs: object) -> None:
        raise PathError("the workspace went away")

    monkeypatch.setattr(status_module, "scan", broken)
    with pytest.raises(PathError, match="went away"):
        index.search(SearchRequest("tomatoes again"))
    assert open_here() == open_before


def test_a_bounded_pending_check_looks_at_the_newest_daily_logs_first(settings: Settings, write,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut short after its first file, the check still sees today's log, the one being written."""
    import clawmem_index.engine.status as status_module

    for day in range(1, 29):
        write(f"memory/2026-02-{day:02}.md", f"day {day}: tomatoes\n")
    index = MemoryIndex(settings)
    index.sync()
    write("memory/2026-02-28.md", "day 28: tomatoes, and a late addition\n")
    monkeypatch.setattr(status_module, "PENDING_CHECK_SECONDS", 0.0)
    assert index.search(SearchRequest("tomatoes"))["index"] == {
        "pending_files": 1, "pending_files_complete": False, "pending_embeddings": 0}


def test_interrupting_a_threads_reader_ends_the_statement_it_runs(settings: Settings, write) -> None:
    """What the daemon does when a query's client hangs up: that thread's SQLite statement fails at once."""
    write("memory/a.md", "# A\nalpha\n")
    index = MemoryIndex(settings)
    index.sync()
    started, outcome = threading.Event(), []

    def endless() -> None:
        store = index.reader()
        started.set()
        try:
            store.conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                               "SELECT count(*) FROM c").fetchall()
        except apsw.InterruptError:
            outcome.append("interrupted")

    worker = threading.Thread(target=endless)
    worker.start()
    assert started.wait(10)
    wait_until(lambda: (index.interrupt(worker.ident or 0), not worker.is_alive())[1], timeout=10,
               message="the statement to end")  # asked again until the statement is running and ends
    assert outcome == ["interrupted"]
    index.interrupt(12345)  # a thread with no reader: nothing to do
    index.close()
