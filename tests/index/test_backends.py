"""The same product on both index backends: SQLite, and a real PostgreSQL with pgvector.

Tests taking the `backend` fixture run once per backend; the others compare the two, or check
what only the shared index has (generations, row-level security, several workspaces).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import psycopg
import pytest
from daemon_helpers import RawClient, daemon_settings, running_daemon, short_dir, wait_until
from hostile import FIXED_TEXTS

from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import IndexUnavailable, QueryError
from clawmem_index.index.pg.schema import grant_workspace
from clawmem_index.search.ranking import SearchRequest

WORDS = ("coffee deploy staging server backup tuesday meeting alice bob kubernetes invoice rollback tokyo berlin"
         " garden running runner runs postgres index memory notes weekly review budget travel flight 東京 会議").split()


def settings_for(workspace: Path, backend: dict[str, str], **more: Any) -> Settings:
    return load_settings(workspace=workspace, overrides={"embedding.provider": "none", **backend, **more})


def random_note(rng: random.Random, lines: int) -> str:
    body = [f"# Note {rng.randint(0, 999)}"]
    for _ in range(lines):
        body.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))))
    return "\n".join(body) + "\n"


def answers(index: MemoryIndex, queries: list[str], **request: Any) -> list[list[tuple[str, int, int, float]]]:
    out = []
    for query in queries:
        found = index.search(SearchRequest(query, min_score=0.0, max_results=8, **request))["results"]
        out.append([(r["path"], r["start_line"], r["end_line"], round(r["score"], 5)) for r in found])
    return out


def test_keyword_answers_are_the_same_on_both_backends(workspace: Path, write, tmp_path: Path, pg_url: str) -> None:
    """BM25 from FTS5 and BM25 computed in PostgreSQL give the same results and scores, edits and deletes included.

    In PostgreSQL both ways: one query per ranking (a CLI), and a long-lived reader's matches kept
    per version and summed in numpy (the daemon's), which must follow every edit.
    """
    rng = random.Random(7)
    sqlite = MemoryIndex(settings_for(workspace, {"index": str(tmp_path / "i.sqlite")}))
    pg = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}))
    daemon = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}), long_lived=True)
    queries = ["coffee", "staging server", "running", "runs", "東京", "会議 東京", "kubernetes rollback budget",
               "tuesday alice", "nothingmatches", "stagng", "kuber", "the", "flight to berlin",
               '"staging server"', 'the "weekly review" budget', '"running runner" notes', '"東京 会議"',
               '"server staging"', '“coffee deploy”']
    try:
        for round_ in range(3):
            for i in range(12):
                if round_ == 0 or rng.random() < 0.4:
                    write(f"memory/n{i}.md", random_note(rng, rng.randint(1, 40)))
            if round_ == 2:
                for i in range(0, 12, 3):
                    (workspace / "memory" / f"n{i}.md").unlink()
            sqlite.sync()
            pg.sync()
            want = answers(sqlite, queries, mode="bm25")
            assert answers(pg, queries, mode="bm25") == want, round_
            assert answers(daemon, queries, mode="bm25") == want, round_
            assert answers(daemon, queries, mode="bm25") == want, round_  # from the kept matches
            assert pg.status()["chunks_indexed"] == sqlite.status()["chunks_indexed"]
    finally:
        sqlite.close()
        pg.close()
        daemon.close()


def test_hybrid_answers_are_the_same_on_both_backends(workspace: Path, write, tmp_path: Path, pg_url: str,
                                                      local_provider) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(11)
    for i in range(10):
        write(f"memory/n{i}.md", random_note(rng, 12))
    # The same answers are the point here, not the query deadline: on a busy machine a query vector late on
    # one side only made that side answer keyword-only (its own tests cover the deadline).
    patient = {"search.query_timeout": 600}
    sqlite = MemoryIndex(settings_for(workspace, {"index": str(tmp_path / "i.sqlite")}, **patient),
                         provider=local_provider)
    pg = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}, **patient),
                     provider=local_provider)
    try:
        sqlite.sync()
        pg.sync()
        assert pg.status()["pending_embeddings"] == 0 and pg.status()["fresh"], pg.status()
        assert pg.status()["vector_search"] == "pgvector HNSW (cosine), exact distances", \
            "the embedding pass ends by building the index it skipped row by row"
        queries = ["coffee with alice", "deploying to the staging server", "trip to Tokyo", "weekly budget review"]
        for mode in ("hybrid", "vector"):
            got, want = answers(pg, queries, mode=mode), answers(sqlite, queries, mode=mode)
            assert [[r[:3] for r in a] for a in got] == [[r[:3] for r in a] for a in want], mode
            for a, b in zip(got, want, strict=True):
                assert [r[3] for r in a] == pytest.approx([r[3] for r in b], abs=1e-4)
    finally:
        sqlite.close()
        pg.close()


def test_every_filter_gives_the_same_answers_on_both_backends(workspace: Path, write, tmp_path: Path,
                                                              pg_url: str) -> None:
    """One filter builder speaks both dialects (path prefix, source, dates): each filter, alone and together."""
    write("MEMORY.md", "# Memory\n\nThe harbour pilot boards at dawn.\n")
    write("memory/2026-11-20.md", "# Log\n\nThe harbour pilot was late.\n")
    write("memory/2026-11-24.md", "# Log\n\nA harbour pilot strike is planned.\n")
    write("memory/ops/harbour.md", "# Ops\n\nHarbour pilot rota.\n")
    sqlite = MemoryIndex(settings_for(workspace, {"index": str(tmp_path / "i.sqlite")}))
    pg = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}))
    filters: list[dict[str, Any]] = [{"path_prefix": "memory/"}, {"path_prefix": "memory/ops/"},
                                     {"path_prefix": "MEM"}, {"source": "memory"}, {"since": "2026-11-21"},
                                     {"before": "2026-11-21"}, {"path_prefix": "memory/2026", "since": "2026-11-01",
                                                               "before": "2026-11-30", "source": "memory"}]
    try:
        sqlite.sync()
        pg.sync()
        for where in filters:
            want = answers(sqlite, ["harbour pilot"], mode="bm25", **where)
            assert want[0], where
            assert answers(pg, ["harbour pilot"], mode="bm25", **where) == want, where
    finally:
        sqlite.close()
        pg.close()


def test_typos_and_dates_are_read_alike_on_both_backends(workspace: Path, write, tmp_path: Path,
                                                         pg_url: str) -> None:
    """The vocabulary a typo is corrected against and the dated chunks a date reads come from each store."""
    for day in range(16, 28):
        write(f"memory/2026-11-{day}.md", f"# Log\n\nThe harbour pilot rota was reviewed (entry {day}).\n")
    write("MEMORY.md", "# Memory\n\nThe harbour pilot boards at dawn.\n")
    sqlite = MemoryIndex(settings_for(workspace, {"index": str(tmp_path / "i.sqlite")}))
    pg = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}))
    daemon = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}), long_lived=True)
    queries = ["harbuor pilot", "pilot rota yesterday", "harbour three days ago", "what happened on November 20",
               "pilto last week", "yesterday", "jarbour pilot", "arbour rota", "the rota on the 20th",
               "the rota the week of November 16", "pilot rota a fortnight ago"]
    try:
        sqlite.sync()
        pg.sync()
        for mode in ("bm25", "hybrid"):
            want = answers(sqlite, queries, mode=mode, now="2026-11-25")
            assert all(want), want
            assert answers(pg, queries, mode=mode, now="2026-11-25") == want, mode
            assert answers(daemon, queries, mode=mode, now="2026-11-25") == want, mode
        for index in (sqlite, pg):
            read = index.search(SearchRequest("harbuor pilot yesterday", mode="bm25", now="2026-11-25"))
            assert read["query"] == {"dates": [{"text": "yesterday", "from": "2026-11-24", "to": "2026-11-24"}],
                                     "corrected": [{"word": "harbuor", "read_as": ["harbour"]}]}
            assert read["results"][0]["path"] == "memory/2026-11-24.md"
            for typed in ("jarbour", "arbour"):  # a neighbouring first key, a dropped first letter
                assert index.search(SearchRequest(typed, mode="bm25"))["query"] == {
                    "corrected": [{"word": typed, "read_as": ["harbour"]}]}
        for index in (sqlite, pg, daemon):  # a quoted phrase matches its words next to each other, in order
            phrase = index.search(SearchRequest('"pilot rota" 2026-11-20', mode="bm25", now="2026-11-25"))
            assert phrase["results"][0]["path"] == "memory/2026-11-20.md" and len(phrase["results"]) == 6
            assert index.search(SearchRequest('"rota pilot"', mode="bm25"))["results"] == []
            assert index.search(SearchRequest('"pilot boards"', mode="bm25", path_prefix="memory/"))["results"] == []
        write("memory/2026-11-27.md", "# Log\n\nThe tugboat crew changed.\n")  # a word new to the vocabulary
        for index in (sqlite, pg, daemon):
            index.sync()
            found = index.search(SearchRequest("tugbaot", mode="bm25"))
            assert [r["path"] for r in found["results"]] == ["memory/2026-11-27.md"]
        (workspace / "memory" / "2026-11-27.md").unlink()
        for index in (sqlite, pg, daemon):
            index.sync()
            gone = index.search(SearchRequest("tugbaot", mode="bm25"))
            assert gone["results"] == [] and "query" not in gone, "a word gone from the index corrects nothing"
    finally:
        sqlite.close()
        pg.close()
        daemon.close()


def test_a_typo_is_read_in_the_context_of_the_question_on_each_backend(backend: dict[str, str], workspace: Path,
                                                                       write) -> None:
    """The chunks the question's other words find come from each store: "fead" beside "books" is "read" (a first-key
    typo, in the note about books) though "fear" is one ordinary typo away and in more notes; "ove" beside "house"
    is "move", not "over"."""
    for i in range(5):
        write(f"memory/fear{i}.md", f"# Note {i}\n\nShe spoke of her fear of heights and went over it, time {i}.\n")
    write("memory/books.md", "# Books\n\nShe likes to read books about sailing.\n")
    write("memory/house.md", "# House\n\nThey plan to move house in May.\n")
    index = MemoryIndex(settings_for(workspace, backend))
    try:
        index.sync()
        for query, typo, read_as, path in (("which books did she fead", "fead", ["read"], "memory/books.md"),
                                           ("when will they ove house", "ove", ["move"], "memory/house.md"),
                                           ("fead", "fead", ["fear"], "memory/fear0.md")):
            found = index.search(SearchRequest(query, mode="bm25"))
            assert found["query"]["corrected"] == [{"word": typo, "read_as": read_as}], query
            assert found["results"][0]["path"] == path, query
    finally:
        index.close()


def test_a_vocabulary_block_too_big_to_read_is_read_by_longer_prefixes(backend: dict[str, str], workspace: Path,
                                                                      write, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit ids fill the block of stems beginning "de": a typo of "deploy" is still read as it."""
    from clawmem_index.index import vocabulary
    from clawmem_index.index.pg import keyword_search

    monkeypatch.setattr(vocabulary, "ROWS", 20)
    monkeypatch.setattr(keyword_search, "VOCABULARY_ROWS", 20)
    write("memory/ids.md", "# Commits\n\n" + " ".join(f"de{i:04x}" for i in range(60)) + "\n")
    write("memory/ops.md", "# Ops\n\nThe deploy went out.\n")
    index = MemoryIndex(settings_for(workspace, backend))
    try:
        index.sync()
        assert index.reader().keywords.vocabulary("de") is None, "more than the rows a block may have"
        found = index.search(SearchRequest("deplyo", mode="bm25"))
        assert found["query"]["corrected"] == [{"word": "deplyo", "read_as": ["deploy"]}]
        assert [r["path"] for r in found["results"]] == ["memory/ops.md"]
    finally:
        index.close()


def test_index_search_get_and_status(backend: dict[str, str], workspace: Path, write) -> None:
    write("MEMORY.md", "# Memory\n\nThe user drinks oat milk flat whites.\n")
    write("memory/2026-11-20.md", "# Log\n\nRolled back the invoice service deploy.\n")
    index = MemoryIndex(settings_for(workspace, backend))
    try:
        report = index.sync()
        assert report.added == 2
        found = index.search(SearchRequest("invoice rollback", mode="bm25"))
        assert [r["path"] for r in found["results"]] == ["memory/2026-11-20.md"]
        assert index.get("MEMORY.md", 3, 1)["text"] == "The user drinks oat milk flat whites."
        status = index.status()
        assert status["index_backend"] == backend["index_backend"]
        assert status["fresh"] is True and status["files_indexed"] == 2
        write("memory/2026-11-20.md", "# Log\n\nNothing about money.\n")
        assert index.status()["fresh"] is False  # a change on disk is never hidden
        index.sync()
        assert index.search(SearchRequest("invoice", mode="bm25"))["results"] == []
        assert index.status()["fresh"] is True
    finally:
        index.close()


def test_notes_dated_by_their_folders_are_dated_and_an_older_index_is_dated_in_place(
        backend: dict[str, str], workspace: Path, write) -> None:
    """`since`/`before` and recency decay see a daily log kept as memory/2026/11/25.md; an index made before
    dates were read from folders (its chunks undated) is dated at its next sync without reading a file."""
    for name in ("memory/2026/11/25.md", "memory/2026/11/26/standup.md", "memory/2025/12/31.md",
                 "memory/notes/walrus.md", "MEMORY.md"):
        write(name, f"# Note\nwalrus seen in {name}\n")
    index = MemoryIndex(settings_for(workspace, backend))

    def dated(**bounds: str) -> list[str]:
        request = SearchRequest("walrus", mode="bm25", min_score=0.0, max_results=20, **bounds)
        return sorted(r["path"] for r in index.search(request)["results"])

    try:
        index.sync()
        assert dated(since="2026-11-26") == ["memory/2026/11/26/standup.md"]
        assert dated(since="2025-01-01", before="2026-11-26") == ["memory/2025/12/31.md", "memory/2026/11/25.md"]
        if backend["index_backend"] == "sqlite":
            old = apsw.Connection(backend["index"])
            old.execute("UPDATE chunks SET date = NULL; DELETE FROM meta WHERE key = 'dating'")
            old.close()
        else:
            with psycopg.connect(backend["index_url"], autocommit=True) as conn:
                conn.execute("UPDATE cm_chunks SET date = NULL")
                conn.execute("DELETE FROM cm_meta WHERE key = 'dating'")
        assert dated(since="2025-01-01") == []
        report = index.sync()
        assert (report.unchanged, report.bytes_read) == (5, 0)
        assert dated(since="2025-01-01") == ["memory/2025/12/31.md", "memory/2026/11/25.md",
                                             "memory/2026/11/26/standup.md"]
    finally:
        index.close()


def test_a_reader_sees_a_sync_at_its_next_search(backend: dict[str, str], workspace: Path, write) -> None:
    """The query cache is keyed by the index's version: another process's commit is seen at once."""
    write("memory/a.md", "alpha note\n")
    writer = MemoryIndex(settings_for(workspace, backend))
    reader = MemoryIndex(settings_for(workspace, backend), read_only=True)
    try:
        writer.sync()
        assert [r["path"] for r in reader.search(SearchRequest("alpha", mode="bm25"))["results"]] == ["memory/a.md"]
        write("memory/b.md", "alpha again\n")
        writer.sync()
        paths = {r["path"] for r in reader.search(SearchRequest("alpha", mode="bm25"))["results"]}
        assert paths == {"memory/a.md", "memory/b.md"}
    finally:
        writer.close()
        reader.close()


def test_a_rebuild_switches_whole_and_a_failed_one_leaves_the_live_index(backend: dict[str, str], workspace: Path,
                                                                         write, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for i in range(6):
        write(f"memory/n{i}.md", f"note {i} about gardening\n")
    index = MemoryIndex(settings_for(workspace, backend))
    try:
        index.sync()
        before = index.search(SearchRequest("gardening", mode="bm25", max_results=20))["results"]
        assert len(before) == 6

        import clawmem_index.engine.write as write_module  # the engine imports it when it writes

        real = write_module.sync_workspace

        def failing(store, settings, **kwargs):  # type: ignore[no-untyped-def]
            real(store, settings, **kwargs)
            raise IndexUnavailable("disk gone mid-rebuild")

        monkeypatch.setattr(write_module, "sync_workspace", failing)
        with pytest.raises(IndexUnavailable):
            index.reindex()
        monkeypatch.setattr(write_module, "sync_workspace", real)
        assert index.search(SearchRequest("gardening", mode="bm25", max_results=20))["results"] == before
        assert index.status()["chunks_indexed"] == 6

        changed = MemoryIndex(settings_for(workspace, backend, **{"chunking.tokens": 64, "chunking.overlap": 8}))
        try:
            changed.sync()  # another chunking: a rebuild
            assert json.loads(json.dumps(changed.status()["fingerprint"]))["chunk_tokens"] == 64
            assert len(changed.search(SearchRequest("gardening", mode="bm25", max_results=20))["results"]) == 6
            assert changed.status()["chunks_indexed"] == 6
        finally:
            changed.close()
        if backend["index_backend"] == "postgres":
            with psycopg.connect(backend["index_url"]) as conn:
                gens = conn.execute("SELECT DISTINCT gen FROM cm_chunks").fetchall()
                live = conn.execute("SELECT live_gen FROM cm_workspaces").fetchall()
            assert gens == live  # nothing of the old generation or the failed rebuild is left
    finally:
        index.close()


def test_the_wal_a_rebuild_wrote_through_is_cut_back_while_readers_stay_open(settings: Settings, write,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import clawmem_index.index.connection as connection

    monkeypatch.setattr(connection, "WAL_LIMIT", 32 << 10)
    for i in range(500):  # an index past SQLite's automatic checkpoint (1,000 pages), as any large one is
        write(f"memory/n{i}.md", f"# Note {i}\n" + f"the greenhouse log {i} holds many words today " * 160 + "\n")
    index = MemoryIndex(settings)
    index.sync()
    assert index.search(SearchRequest("greenhouse", mode="bm25"))["results"]  # a reader stays open, as a daemon's
    index.reindex()
    wal = Path(f"{settings.index_path}-wal")
    swapped = wal.stat().st_size
    assert swapped > 1 << 20  # the swap wrote the whole index through the WAL
    write("memory/n0.md", "# Note 0\nedited\n")
    index.sync()  # its commit starts the WAL over, cut back to the limit, then adds its own pages
    assert index.search(SearchRequest("edited", mode="bm25"))["results"]
    assert wal.stat().st_size < swapped // 8
    index.close()


def test_every_pragma_of_a_connection_takes_effect(tmp_path: Path) -> None:
    """apsw stops a many-statement `execute` at the first row (journal_mode answers one)."""
    from clawmem_index.index.connection import WAL_LIMIT
    from clawmem_index.index.store import Store

    live, fresh = Store(tmp_path / "live.sqlite"), Store(tmp_path / "fresh.sqlite", fast_unsafe=True)
    assert [live.execute(f"PRAGMA {p}")[0][0] for p in ("journal_mode", "synchronous", "journal_size_limit")] == [
        "wal", 1, WAL_LIMIT]
    assert [fresh.execute(f"PRAGMA {p}")[0][0] for p in ("journal_mode", "synchronous")] == ["off", 0]
    assert live.execute("PRAGMA wal_autocheckpoint")[0][0] == 1000  # SQLite's own, for every connection but one:
    live.close()
    fresh.close()
    from clawmem_index.index.backends import SqliteBackend

    first = SqliteBackend(load_settings(workspace=tmp_path, overrides={"index": str(tmp_path / "first.sqlite")},
                                        environ={})).create_live()  # a first index, written where it is searched
    assert first.execute("PRAGMA wal_autocheckpoint")[0][0] == WAL_LIMIT // first.execute("PRAGMA page_size")[0][0]
    first.close()


def test_the_hostile_corpus_is_indexed_and_searched(backend: dict[str, str], workspace: Path, write) -> None:
    for n, (name, text) in enumerate(FIXED_TEXTS.items()):
        write(f"memory/h{n}.md", f"# {name}\n{text}\nmarker{n}\n".encode("utf-8", "surrogatepass"))
    index = MemoryIndex(settings_for(workspace, backend))
    try:
        report = index.sync()
        assert report.added == len(FIXED_TEXTS), report.errors
        for n, text in enumerate(FIXED_TEXTS.values()):
            try:
                assert isinstance(index.search(SearchRequest(text[:2000], mode="bm25"))["results"], list)
            except QueryError:
                pass  # a query with no searchable word: a defined error
            assert f"memory/h{n}.md" in [r["path"] for r in index.search(SearchRequest(f"marker{n}", mode="bm25"))
                                         ["results"]]
        assert index.status()["fresh"] is True
    finally:
        index.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def test_a_daemon_serves_the_shared_index(workspace: Path, write, tmp_path: Path, pg_url: str,
                                          sock_dir: Path) -> None:
    write("memory/a.md", "the ferry leaves at nine\n")
    settings = daemon_settings(workspace, tmp_path, sock_dir, index_backend="postgres", index_url=pg_url)
    with running_daemon(settings), RawClient(settings.socket_path) as client:
        def found() -> list[str]:
            reply = client.call("search", {"query": "ferry", "mode": "bm25"})
            return [r["path"] for r in reply["result"]["results"]]

        wait_until(lambda: found() == ["memory/a.md"], message="the first build")
        write("memory/b.md", "a ferry again\n")
        wait_until(lambda: sorted(found()) == ["memory/a.md", "memory/b.md"], message="the edit searchable")
        status = client.call("status")["result"]
        assert status["index_backend"] == "postgres" and "password" not in json.dumps(status)


def test_a_daemon_whose_workspace_another_folder_writes_says_so_and_writes_nothing(tmp_path: Path, pg_url: str,
                                                                                    sock_dir: Path) -> None:
    first, second = tmp_path / "host-a" / "ops", tmp_path / "host-b" / "ops"  # one name: "ops"
    for ws, word in ((first, "lighthouse"), (second, "harbour")):
        (ws / "memory").mkdir(parents=True)
        (ws / "memory" / f"{word}.md").write_text(f"{word} keeper notes\n")
    MemoryIndex(settings_for(first, {"index_backend": "postgres", "index_url": pg_url})).sync()
    settings = daemon_settings(second, tmp_path, sock_dir, index_backend="postgres", index_url=pg_url)
    with running_daemon(settings), RawClient(settings.socket_path) as client:
        status = wait_until(lambda: (s := client.call("status")["result"]) and "written by another folder" in
                            str(s["last_error"]) and s, message="the refusal in status")
        assert status["fresh"] is False and "take-over" in status["last_error"]
        answer = client.call("search", {"query": "keeper", "mode": "bm25"})["result"]  # still answering
        assert answer["index"]["pending_files"] > 0  # from an index that does not hold this folder's files: said
        assert client.call("search", {"query": "harbour", "mode": "bm25"})["result"]["results"] == []
    probe = MemoryIndex(settings_for(first, {"index_backend": "postgres", "index_url": pg_url}), read_only=True)
    try:
        assert [r["path"] for r in probe.search(SearchRequest("keeper", mode="bm25"))["results"]] == \
            ["memory/lighthouse.md"]  # the first folder's rows are untouched
    finally:
        probe.close()


def test_a_rebuild_gives_the_planner_its_workspaces_statistics(workspace: Path, write, pg_url: str) -> None:
    """Until autovacuum's first round the planner guesses a new partition's size from its pages, and
    at a few thousand chunks it scanned the whole workspace for a rare word instead of using the
    keyword index: the rebuild analyzes the partition before its switch."""
    for n in range(40):
        write(f"memory/n{n}.md", random_note(random.Random(n), 12))
    index = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}))
    try:
        index.sync()
    finally:
        index.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        chunks = conn.execute("SELECT count(*) FROM cm_chunks").fetchone()
        known = conn.execute("SELECT reltuples FROM pg_class WHERE relname = cm_partition_name(%s)",
                             (workspace.name,)).fetchone()
    assert chunks is not None and known is not None and chunks[0] > 0
    assert known[0] == chunks[0]  # -1 when never analyzed


def test_the_cli_indexes_into_postgres_from_the_environment(workspace: Path, write, pg_url: str) -> None:
    write("memory/a.md", "lighthouse keeper notes\n")
    env = {**os.environ, "CLAWMEM_INDEX_BACKEND": "postgres", "CLAWMEM_INDEX_URL": pg_url,
           "CLAWMEM_WORKSPACE_NAME": "Keeper Notes", "CLAWMEM_PROVIDER": "none"}
    run = [sys.executable, "-m", "clawmem_index"]
    subprocess.run([*run, "index", "--workspace", str(workspace)], env=env, check=True, capture_output=True)
    out = subprocess.run([*run, "search", "lighthouse", "--workspace", str(workspace), "--json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert [r["path"] for r in json.loads(out)["results"]] == ["memory/a.md"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT workspace FROM cm_workspaces").fetchall() == [("keeper-notes",)]


def test_two_folders_of_one_workspace_name_cannot_both_write_it(tmp_path: Path, pg_url: str) -> None:
    """Two hosts configured with one name would each drop the other's files from the workspace: the second
    folder is refused until it takes the workspace over, and from then on the first one is."""
    first, second = tmp_path / "host-a" / "ops", tmp_path / "host-b" / "ops"  # the same default name: "ops"
    for ws, word in ((first, "lighthouse"), (second, "harbour")):
        (ws / "memory").mkdir(parents=True)
        (ws / "memory" / f"{word}.md").write_text(f"{word} keeper notes\n")
    env = {**os.environ, "CLAWMEM_INDEX_BACKEND": "postgres", "CLAWMEM_INDEX_URL": pg_url, "CLAWMEM_PROVIDER": "none"}

    def clawmem(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "clawmem_index", *args, "--workspace", str(ws)], env=env,
                              capture_output=True, text=True)

    def found(ws: Path) -> list[str]:
        out = clawmem(ws, "search", "keeper", "--mode", "bm25", "--json")
        assert out.returncode == 0, out.stderr
        return [r["path"] for r in json.loads(out.stdout)["results"]]

    assert clawmem(first, "index").returncode == 0
    refused = clawmem(second, "index")
    assert refused.returncode == 3 and "written by another folder" in refused.stderr and "take-over" in refused.stderr
    assert found(first) == ["memory/lighthouse.md"]  # the first folder's rows are untouched
    taken = clawmem(second, "take-over")
    assert taken.returncode == 0, taken.stderr
    assert clawmem(second, "index").returncode == 0
    assert found(second) == ["memory/harbour.md"]
    assert clawmem(first, "index").returncode == 3
    assert found(second) == ["memory/harbour.md"]
    status = json.loads(clawmem(first, "status", "--json").stdout)
    assert status["fresh"] is False  # the index does not hold this folder's files, and says so
    assert any("writes this workspace" in reason and "take-over" in reason for reason in status["stale_reasons"])
    assert "files_held_by" not in status  # a folder with files of its own is no reader
    sqlite = subprocess.run([sys.executable, "-m", "clawmem_index", "take-over", "--workspace", str(first)],
                            env={**env, "CLAWMEM_INDEX_BACKEND": "sqlite"}, capture_output=True, text=True)
    assert sqlite.returncode == 1 and "shared index" in sqlite.stderr


def test_a_password_in_the_settings_file_is_refused(workspace: Path) -> None:
    (workspace / "clawmem.toml").write_text('index_backend = "postgres"\nindex_url = "postgresql://a:secret@db/x"\n')
    from clawmem_index.errors import ConfigError

    with pytest.raises(ConfigError, match="PGPASSWORD"):
        load_settings(workspace=workspace)


def test_row_level_security_keeps_a_role_to_its_workspaces(tmp_path: Path, pg_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    """A role granted workspace alpha cannot read beta's rows, even with its own SQL, nor write alpha's if read-only."""
    for name in ("alpha", "beta"):
        ws = tmp_path / name
        (ws / "memory").mkdir(parents=True)
        (ws / "memory" / "secret.md").write_text(f"the {name} launch code\n")
        MemoryIndex(settings_for(ws, {"index_backend": "postgres", "index_url": pg_url})).sync()
    (reader, reader_url), (writer, writer_url) = pg_role("reader"), pg_role("writer")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, reader, "alpha")
        grant_workspace(conn, writer, "beta", writable=True)
    with psycopg.connect(reader_url, autocommit=True) as conn:
        assert {r[0] for r in conn.execute("SELECT workspace FROM cm_chunks")} == {"alpha"}
        assert conn.execute("SELECT count(*) FROM cm_chunks WHERE text LIKE '%beta%'").fetchone() == (0,)
        assert {r[0] for r in conn.execute("SELECT workspace FROM cm_vectors")} == {"alpha"}
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM cm_chunks")
    with psycopg.connect(writer_url, autocommit=True) as conn:
        assert conn.execute("DELETE FROM cm_chunks WHERE workspace = 'alpha'").rowcount == 0
        assert conn.execute("UPDATE cm_vectors SET embedded = true WHERE workspace = 'alpha'").rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO cm_meta VALUES('alpha', 0, 'k', 'v')")
    # Through clawmem: the reader searching as alpha finds alpha's note; beta's index is not there for it.
    alpha = MemoryIndex(settings_for(tmp_path / "alpha", {"index_backend": "postgres", "index_url": reader_url}),
                        read_only=True)
    beta = MemoryIndex(settings_for(tmp_path / "beta", {"index_backend": "postgres", "index_url": reader_url}),
                       read_only=True)
    try:
        assert [r["path"] for r in alpha.search(SearchRequest("launch code", mode="bm25"))["results"]] == \
            ["memory/secret.md"]
        with pytest.raises(IndexUnavailable):
            beta.search(SearchRequest("launch code", mode="bm25"))
    finally:
        alpha.close()
        beta.close()


def test_a_search_across_workspaces_names_each_results_workspace(tmp_path: Path, pg_url: str) -> None:
    for name in ("alpha", "beta"):
        ws = tmp_path / name
        (ws / "memory").mkdir(parents=True)
        (ws / "MEMORY.md").write_text(f"# {name}\n\nThe {name} agent learned the database failover runbook.\n")
        MemoryIndex(settings_for(ws, {"index_backend": "postgres", "index_url": pg_url})).sync()
    index = MemoryIndex(settings_for(tmp_path / "alpha", {"index_backend": "postgres", "index_url": pg_url}))
    try:
        own = index.search(SearchRequest("failover runbook", mode="bm25"))
        assert [(r["workspace"], r["path"]) for r in own["results"]] == [("alpha", "MEMORY.md")]
        both = index.search(SearchRequest("failover runbook", mode="bm25", workspaces=("alpha", "Beta", "gamma")))
        assert sorted((r["workspace"], r["path"]) for r in both["results"]) == [("alpha", "MEMORY.md"),
                                                                                ("beta", "MEMORY.md")]
        assert both["unreadable_workspaces"] == ["gamma"]
    finally:
        index.close()
    sqlite = MemoryIndex(settings_for(tmp_path / "alpha", {"index": str(tmp_path / "i.sqlite")}))
    try:
        sqlite.sync()
        with pytest.raises(QueryError, match="shared index"):
            sqlite.search(SearchRequest("failover", workspaces=("beta",)))
    finally:
        sqlite.close()


def test_a_text_is_embedded_once_for_the_fleet(tmp_path: Path, pg_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    """Beta's writer (a role granted only beta) embeds none of the texts alpha's already did: the cache is shared."""
    from clawmem_index.embeddings.fake import FakeProvider

    for name in ("alpha", "beta"):
        (tmp_path / name / "memory").mkdir(parents=True)
        for i in range(4):
            (tmp_path / name / "memory" / f"n{i}.md").write_text(f"# Runbook {i}\nrestart the queue worker {i}\n")
    (tmp_path / "beta" / "memory" / "own.md").write_text("# Beta\nonly beta knows the pager rota\n")
    writer, writer_url = pg_role("writer")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, writer, "beta", writable=True)
    first = FakeProvider()
    MemoryIndex(settings_for(tmp_path / "alpha", {"index_backend": "postgres", "index_url": pg_url}),
                provider=first).sync()
    second = FakeProvider()
    beta = MemoryIndex(settings_for(tmp_path / "beta", {"index_backend": "postgres", "index_url": writer_url}),
                       provider=second)
    try:
        report = beta.sync()
        assert (report.embedded, report.from_cache) == (1, 4)
        assert (first.documents_embedded, second.documents_embedded) == (4, 1)
        found = beta.search(SearchRequest("restart the queue worker 2", mode="vector", min_score=0.0))["results"]
        assert found and found[0]["path"] == "memory/n2.md"
    finally:
        beta.close()


def test_the_fleets_cache_gives_a_role_no_vector_of_a_text_it_does_not_hold(tmp_path: Path, pg_url: str,  # type: ignore[no-untyped-def]
                                                                            pg_role) -> None:
    """A vector gives much of its text back: no workspace role may list the shared cache, a writer looks
    up only the hashes of texts it has (what sharing the cache needs), a reader not even that."""
    from clawmem_index.embeddings.fake import FakeProvider

    (tmp_path / "alpha" / "memory").mkdir(parents=True)
    (tmp_path / "alpha" / "memory" / "secret.md").write_text("# Alpha\nthe alpha launch code is 7741\n")
    MemoryIndex(settings_for(tmp_path / "alpha", {"index_backend": "postgres", "index_url": pg_url}),
                provider=FakeProvider()).sync()
    (reader, reader_url), (writer, writer_url) = pg_role("reader"), pg_role("writer")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, reader, "alpha")
        grant_workspace(conn, writer, "beta", writable=True)
        cached = conn.execute("SELECT provider, model, provider_key, hash FROM cm_embedding_cache").fetchall()
    assert cached
    provider, model, key, text_hash = cached[0]
    for url in (reader_url, writer_url):
        with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT embedding FROM cm_embedding_cache")
    with psycopg.connect(reader_url, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM cm_cached(%s, %s, %s, %s, NULL)", (provider, model, key, [text_hash]))
    with psycopg.connect(writer_url, autocommit=True) as conn:
        found = conn.execute("SELECT hash FROM cm_cached(%s, %s, %s, %s, NULL)",
                             (provider, model, key, [text_hash, "0" * 16])).fetchall()
        assert found == [(text_hash,)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE cm_embedding_cache SET embedding = '\\x00000000'")


def test_context_across_workspaces_reads_the_others_lines_from_the_index(tmp_path: Path, pg_url: str) -> None:
    """Another workspace's lines are its chunks' text (its files are on its own host), labelled with its name."""
    shared = {"index_backend": "postgres", "index_url": pg_url}
    notes = {"alpha": "# alpha\n\nThe alpha agent learned the database failover runbook.\n",
             "beta": "# beta\n\n" + "\n".join(f"- step {i}: the failover runbook says check replica {i} lag."
                                             + ("\n" if i % 4 == 0 else "") for i in range(30)) + "\n"}
    for name, text in notes.items():
        ws = tmp_path / name
        (ws / "memory").mkdir(parents=True)
        (ws / "MEMORY.md").write_text(text)
        (ws / "memory" / "long.md").write_text("# long\n\nbefore\n" + "failover " * 300 + "\nafter\n")
        index = MemoryIndex(settings_for(ws, shared, **{"chunking.tokens": 64, "chunking.overlap": 16}))
        index.sync()
        index.close()
    beta_lines = notes["beta"].split("\n")
    index = MemoryIndex(settings_for(tmp_path / "alpha", shared))
    try:
        block = index.context(SearchRequest("failover runbook", mode="bm25", max_results=20, path_prefix="MEMORY.md",
                                            workspaces=("alpha", "beta")), 100_000)
        sections = block["sections"]
        assert {s.get("workspace") for s in sections} == {None, "beta"}, "this workspace's sections keep their label"
        assert "### MEMORY.md#L1-L3\n# alpha" in block["text"]
        beta = [s for s in sections if s.get("workspace") == "beta"]
        assert beta and all(s["citation"].startswith("beta:MEMORY.md#L") for s in beta)
        for s in beta:
            label = f"### {s['citation']}\n"
            assert label + "\n".join(beta_lines[s["start_line"] - 1:s["end_line"]]) in block["text"], s
        assert sum(s["end_line"] - s["start_line"] + 1 for s in beta) > 20, "lines of many overlapping chunks"
        store = index.reader()
        assert store.chunk_lines("beta", "MEMORY.md", 1, 10_000) == beta_lines[:-1], "each line once, blanks too"
        assert store.chunk_lines("beta", "MEMORY.md", 5, 6) == beta_lines[4:6]
        assert store.chunk_lines("beta", "memory/long.md", 1, 5) == ["# long", "", "before", None, "after"], \
            "a line held in pieces is not shown"
        assert store.chunk_lines("beta", "memory/none.md", 1, 5) == []
        assert store.chunk_lines("beta", "MEMORY.md", 10_000, 10_001) == []
    finally:
        index.close()
    # The CLI's --workspace-set, as the issue asks: the same block, and a name not readable is noted.
    (tmp_path / "alpha" / "clawmem.toml").write_text("[chunking]\ntokens = 64\noverlap = 16\n")
    env = {**os.environ, "CLAWMEM_INDEX_BACKEND": "postgres", "CLAWMEM_INDEX_URL": pg_url, "CLAWMEM_PROVIDER": "none"}
    cli = subprocess.run([sys.executable, "-m", "clawmem_index", "context", "failover runbook", "--mode", "bm25",
                          "-n", "20", "--budget", "100000", "--path-prefix", "MEMORY.md",
                          "--workspace-set", "alpha, beta,gamma", "--workspace", str(tmp_path / "alpha")],
                         env=env, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == block["text"].strip() and "gamma" in cli.stderr
    sqlite = MemoryIndex(settings_for(tmp_path / "alpha", {"index": str(tmp_path / "i.sqlite")}))
    try:
        sqlite.sync()
        with pytest.raises(QueryError, match="shared index"):
            sqlite.context(SearchRequest("failover", workspaces=("beta",)))
        assert sqlite.context(SearchRequest("failover", workspaces=("alpha",)))["sections"], "its own name is itself"
    finally:
        sqlite.close()


def test_a_server_killed_mid_sync_is_reported_and_the_index_catches_up(workspace: Path, write, tmp_path: Path,
                                                                        sock_dir: Path) -> None:
    """SIGKILL PostgreSQL while the daemon indexes: status says so, and after the restart the index equals a fresh
    build."""
    import pg_server

    server = pg_server.start()
    try:
        files = 1500
        for i in range(files):
            write(f"memory/n{i:04}.md", f"# Note {i}\n\n" + f"line about topic{i % 17} and more words\n" * 40)
        settings = daemon_settings(workspace, tmp_path, sock_dir, index_backend="postgres", index_url=server.url())

        def rows_written() -> int:
            with psycopg.connect(server.url()) as conn:
                exists = conn.execute("SELECT to_regclass('cm_chunks') IS NOT NULL").fetchone()
                return int(conn.execute("SELECT count(*) FROM cm_chunks").fetchone()[0]) if exists[0] else 0

        with running_daemon(settings) as daemon, RawClient(settings.socket_path) as client:
            written = wait_until(rows_written, interval=0.005, message="the first rows of the first build")
            server.kill()
            assert 0 < written < files  # killed mid-sync: part of the build was committed
            reply = client.call("status")
            assert "result" in reply, reply  # the daemon keeps answering
            assert reply["result"]["fresh"] is False
            assert "shared index" in " ".join(reply["result"]["stale_reasons"])
            searched = client.call("search", {"query": "topic3", "mode": "bm25"})
            assert "error" in searched and "shared index" in searched["error"]["message"]
            server.start()
            wait_until(lambda: client.call("status")["result"].get("fresh") is True, timeout=60,
                       message="the daemon catching up after the restart")
            assert daemon is not None
        with psycopg.connect(server.url()) as conn:
            got = sorted(conn.execute("SELECT path, start_line, end_line, hash FROM cm_chunks AS c JOIN cm_workspaces"
                                      " AS w ON w.workspace = c.workspace AND w.live_gen = c.gen").fetchall())
            stats = conn.execute("SELECT s.chunks, (SELECT sum(df) FROM cm_terms AS t WHERE t.gen = s.gen)"
                                 " FROM cm_stats AS s JOIN cm_workspaces AS w ON w.live_gen = s.gen").fetchone()
        fresh_url = server.url()
        with psycopg.connect(fresh_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE fresh")
        fresh = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": server.url("fresh")}))
        fresh.sync()
        fresh.close()
        with psycopg.connect(server.url("fresh")) as conn:
            want = sorted(conn.execute("SELECT path, start_line, end_line, hash FROM cm_chunks").fetchall())
            want_stats = conn.execute("SELECT chunks, (SELECT sum(df) FROM cm_terms) FROM cm_stats").fetchone()
        assert len(got) == len(want) and got == want  # nothing lost, nothing twice
        assert stats == want_stats  # the term statistics BM25 reads are those of a fresh build
    finally:
        server.close()


def test_the_shared_index_demo_searches_two_daemons_workspaces() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "shared_demo.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, check=True).stdout
    assert "ops:memory/2026-11-20.md" in out and "support:memory/2026-11-21.md" in out, out


def test_daemon_readers_of_one_sqlite_index_share_its_caches(tmp_path: Path) -> None:
    """Kept keyword scores and vector cells: one of each for the long-lived readers, none for a one-shot one."""
    from clawmem_index.index.backends import SqliteBackend
    from clawmem_index.index.store import Store

    settings = load_settings(workspace=tmp_path, overrides={"index": str(tmp_path / "i.sqlite")}, environ={})
    Store(settings.index_path).close()
    backend = SqliteBackend(settings)
    first, second = (backend.open_reader(read_only=True, long_lived=True) for _ in range(2))
    one_shot = backend.open_reader(read_only=True, long_lived=False)
    assert first.keywords._postings is second.keywords._postings
    assert one_shot.keywords._postings is not first.keywords._postings
    assert first.vectors._cells._shared is not None and first.vectors._cells._shared is second.vectors._cells._shared
    assert one_shot.vectors._cells._shared is None  # a one-shot search reads its few cells itself
    for store in (first, second, one_shot):
        store.close()


def test_the_last_character_of_a_prefix_bounds_its_range() -> None:
    from clawmem_index.index.filters import prefix_upper

    assert prefix_upper("de") == "df" and prefix_upper("a\ud7ff") == "a\ue000" and prefix_upper("x\U0010ffff") is None


def test_a_reader_in_another_folder_does_not_claim_the_writers_files_changed(tmp_path: Path, pg_url: str,
                                                                            pg_role) -> None:  # type: ignore[no-untyped-def]
    """A dashboard's role reads workspace alpha from a folder of its own (no memory files): comparing that folder
    with alpha's index said '1 file(s) changed' and fresh: false. The files are the writer's: it says so instead."""
    writer_ws, reader_ws = tmp_path / "alpha", tmp_path / "dashboard"
    (writer_ws / "memory").mkdir(parents=True)
    (writer_ws / "memory" / "plan.md").write_text("the alpha launch plan\n")
    (reader_ws / "memory").mkdir(parents=True)
    MemoryIndex(settings_for(writer_ws, {"index_backend": "postgres", "index_url": pg_url,
                                         "workspace_name": "alpha"})).sync()
    reader, reader_url = pg_role("dashboard")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, reader, "alpha")
    dashboard = MemoryIndex(settings_for(reader_ws, {"index_backend": "postgres", "index_url": reader_url,
                                                     "workspace_name": "alpha"}), read_only=True)
    writer = MemoryIndex(settings_for(writer_ws, {"index_backend": "postgres", "index_url": pg_url,
                                                  "workspace_name": "alpha"}), read_only=True)
    try:
        answer = dashboard.search(SearchRequest("launch plan", mode="bm25"))
        assert [r["path"] for r in answer["results"]] == ["memory/plan.md"]
        assert answer["index"]["pending_files"] == 0 and answer["index"]["files_held_by"]
        status = dashboard.status()
        assert status["pending_files"] == 0 and status["fresh"] is True, status["stale_reasons"]
        assert status["files_held_by"] and status["files_on_disk"] == 1
        # The writer's own folder is still compared with the index: an edit there is pending.
        (writer_ws / "memory" / "plan.md").write_text("the alpha launch plan, moved to Friday\n")
        assert writer.search(SearchRequest("launch plan", mode="bm25"))["index"]["pending_files"] == 1
        assert "files_held_by" not in writer.status()
    finally:
        dashboard.close()
        writer.close()


def test_interrupting_a_threads_shared_index_reader_cancels_its_statement(workspace: Path, write, pg_url: str) -> None:
    """On the shared index, a query whose client has gone is cancelled by the server, as SQLite's is interrupted."""
    import threading

    from daemon_helpers import wait_until

    write("memory/a.md", "# A\nalpha\n")
    index = MemoryIndex(settings_for(workspace, {"index_backend": "postgres", "index_url": pg_url}))
    index.sync()
    started, outcome = threading.Event(), []

    def endless() -> None:
        store = index.reader()
        started.set()
        try:
            store.conn.execute("SELECT pg_sleep(120)")
        except IndexUnavailable as exc:  # the store's words for a statement the server cancelled
            outcome.append("cancelled" if "canceling statement" in str(exc) else str(exc))

    worker = threading.Thread(target=endless)
    worker.start()
    assert started.wait(10)
    wait_until(lambda: (index.interrupt(worker.ident or 0), not worker.is_alive())[1], timeout=30,
               message="the statement to be cancelled")
    assert outcome == ["cancelled"]
    index.close()


def test_each_backend_says_a_full_disk_as_disk_full_and_lets_the_rest_pass(backend: dict[str, str],
                                                                          workspace: Path) -> None:
    """The engine catches no driver's exception: around a write, a backend says its own driver's full disk (SQLite's
    FullError, the server's disk_full) as DiskFull, the one-line error the CLI and `status` show
    (tests/index/test_full_disk.py fills a real disk under SQLite)."""
    import apsw
    import psycopg

    from clawmem_index.errors import DiskFull
    from clawmem_index.index.backends import backend_for

    chosen = backend_for(settings_for(workspace, backend))
    full = apsw.FullError("database or disk is full") if chosen.name == "sqlite" \
        else psycopg.errors.DiskFull("could not extend file: No space left on device")
    with pytest.raises(DiskFull, match="is full") as raised, chosen.writing():
        raise full
    assert raised.value.__cause__ is full and "free some space" in str(raised.value)
    with pytest.raises(ValueError), chosen.writing():
        raise ValueError("not the disk's")
