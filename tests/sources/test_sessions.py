"""The opt-in sessions source: agent transcripts (`sessions/**/*.jsonl`) indexed by their user and assistant text."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import BOUND, DEBOUNCE, daemon_settings, running_daemon, short_dir, wait_until
from watchdog.events import DirCreatedEvent, FileModifiedEvent

from clawmem_index.config import Settings, load_settings, with_overrides
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ConfigError, PathError
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.client import DaemonClient
from clawmem_index.service.watcher import WorkspaceWatcher
from clawmem_index.sources.sessions import CARRY_CHARS, SAMPLE_BYTES, STATE_VERSION, Message, TailState

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

KEY = "sessions/2026-11-22-abc.jsonl"


def header(timestamp: object = "2026-11-22T09:00:00Z") -> dict[str, Any]:
    return {"type": "session", "version": 1, "id": "s-1", "timestamp": timestamp, "agent_id": "main"}


def message(role: str, content: object, timestamp: object = "2026-11-22T10:00:00Z") -> dict[str, Any]:
    line: dict[str, Any] = {"type": "message", "id": "m", "message": {"role": role, "content": content}}
    if timestamp is not None:
        line["timestamp"] = timestamp
    return line


def jsonl(*lines: object) -> str:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)


@pytest.fixture
def ssettings(settings: Settings) -> Settings:
    """The test settings with the sessions source on."""
    return load_settings(workspace=settings.workspace, overrides={
        "index": str(settings.index_path), "embedding.provider": "none", "sources": ["memory", "sessions"]})


def search(index: MemoryIndex, query: str, **params: Any) -> list[dict[str, Any]]:
    answer = index.search(SearchRequest(query, max_results=50, min_score=0.0, mode="bm25", **params))
    return list(answer["results"])  # type: ignore[call-overload]


def ranges(index: MemoryIndex, query: str, **params: Any) -> list[tuple[str, int, int, str]]:
    return [(r["path"], r["start_line"], r["end_line"], r["source"]) for r in search(index, query, **params)]


# -- what is indexed ----------------------------------------------------------------------------


def test_an_assistant_message_is_found_with_its_jsonl_line_range(ssettings: Settings, write) -> None:
    write(KEY, jsonl(
        header(),
        message("user", "Where does the deploy config live?"),
        {"type": "tool_call", "id": "t1", "timestamp": "2026-11-22T10:00:01Z", "tool": "search", "input": {"q": "x"}},
        {"type": "tool_result", "id": "t1", "timestamp": "2026-11-22T10:00:02Z", "tool": "search", "output": {}},
        message("assistant", [{"type": "text", "text": "The aardvark config is in /etc/zebra."},
                              {"type": "tool_use", "id": "u", "name": "read", "input": {"path": "/etc"}}]),
    ))
    index = MemoryIndex(ssettings)
    report = index.sync()
    assert report.added == 1 and report.malformed_lines == 0
    assert ranges(index, "aardvark") == [(KEY, 2, 5, "sessions")]
    [hit] = search(index, "aardvark")
    assert hit["snippet"] == ("User: Where does the deploy config live?\n"
                              "Assistant: The aardvark config is in /etc/zebra.")


def test_long_transcripts_are_chunked_in_windows_that_map_to_their_lines(ssettings: Settings, write) -> None:
    lines: list[object] = [header()]
    for n in range(60):
        lines.append(message("user" if n % 2 else "assistant", f"turn{n} " + "words about the plan " * 12))
    write(KEY, jsonl(*lines))
    index = MemoryIndex(ssettings)
    index.sync()
    chunks = index.reader().execute("SELECT start_line, end_line, text FROM chunks ORDER BY start_line")
    assert len(chunks) > 5
    for start, end, text in chunks:
        first = text.split("\n")[0]
        assert f"turn{start - 2} " in first, (start, first)  # message n sits on JSONL line n + 2
        assert f"turn{end - 2} " in text.split("\n")[-1]
    assert chunks[0][0] == 2 and chunks[-1][1] == 61
    assert all(b[0] <= a[1] + 1 for a, b in itertools.pairwise(chunks))  # no message left out


def test_only_user_and_assistant_text_is_indexed_and_malformed_lines_are_counted(ssettings: Settings, write) -> None:
    write(KEY, jsonl(
        header(),
        message("system", "systemsecret instructions"),
        message("user", [{"type": "text", "text": "hello numbat"}, {"type": "image", "source": "imagesecret"}]),
        message("assistant", [{"type": "thinking", "thinking": "thinkingsecret"},
                              {"type": "tool_use", "name": "run", "input": {"cmd": "toolusesecret"}},
                              {"type": "text", "text": "numbat reply"}]),
        message("tool", "toolrolesecret"),
        {"type": "tool_call", "tool": "search", "input": {"q": "toolcallsecret"}},
        {"type": "tool_result", "tool": "search", "output": {"text": "toolresultsecret"}},
        {"type": "compaction", "summary": "compactionsecret"},
        "not json at all malformedsecret",
        '["an", "array", "arraysecret"]',
        '"a bare string"',
        {"no_type": "notypesecret"},
        {"type": "message", "message": "shapesecret"},
        {"type": "message", "message": {"role": "user", "content": 42}},
    ).encode() + b'{"type":"message","message":{"role":"user","content":"latin1secret caf\xe9"}}\n')
    index = MemoryIndex(ssettings)
    report = index.sync()
    assert ranges(index, "numbat") == [(KEY, 3, 4, "sessions")]
    for secret in ("systemsecret", "imagesecret", "thinkingsecret", "toolusesecret", "toolrolesecret",
                   "toolcallsecret", "toolresultsecret", "compactionsecret", "malformedsecret", "arraysecret",
                   "notypesecret", "shapesecret", "latin1secret"):
        assert search(index, secret) == [], secret
    assert report.malformed_lines == 7
    assert any(s.startswith(f"{KEY}: 7 malformed transcript lines skipped (line 9, 10, 11, 12, 13, ...)")
               for s in report.skipped), report.skipped
    assert index.status()["last_sync_problem_count"] == 1


def test_chunks_are_dated_by_their_first_message_and_since_before_filter_them(ssettings: Settings, write) -> None:
    small = with_overrides(ssettings, chunking={"tokens": 24, "overlap": 0})  # one message a chunk
    filler = "about the walrus migration plan and its many steps"
    write(KEY, jsonl(
        header("2026-11-01T12:00:00Z"),
        message("user", f"first {filler}", "2026-11-20T10:00:00Z"),
        message("assistant", f"second {filler}", "2026-11-23T01:30:00+02:00"),  # 2026-11-22 in UTC
        message("user", f"third {filler}", 1_795_500_000),  # epoch seconds: 2026-11-24
        message("assistant", f"fourth {filler}", 1_795_586_400_000),  # epoch milliseconds: 2026-11-25
        message("user", f"fifth {filler}", None),  # no timestamp: the session header's date
        message("user", f"sixth {filler}", "not a time"),
    ))
    index = MemoryIndex(small)
    index.sync()
    dated = index.reader().execute("SELECT start_line, date FROM chunks ORDER BY start_line")
    assert dated == [(2, "2026-11-20"), (3, "2026-11-22"), (4, "2026-11-24"), (5, "2026-11-25"),
                     (6, "2026-11-01"), (7, "2026-11-01")]
    assert [r[1] for r in ranges(index, "walrus", since="2026-11-22", before="2026-11-25")] == [3, 4]
    assert [r[1] for r in ranges(index, "walrus", before="2026-11-02")] == [6, 7]


def test_the_source_filter_picks_memory_or_sessions(ssettings: Settings, write) -> None:
    write("MEMORY.md", "# Memory\n- the quokka lives in the garden\n")
    write(KEY, jsonl(header(), message("user", "did you feed the quokka today?")))
    index = MemoryIndex(ssettings)
    index.sync()
    assert {r[0] for r in ranges(index, "quokka")} == {"MEMORY.md", KEY}
    assert ranges(index, "quokka", source="sessions") == [(KEY, 2, 2, "sessions")]
    assert [(r[0], r[3]) for r in ranges(index, "quokka", source="memory")] == [("MEMORY.md", "memory")]


def test_sessions_are_off_by_default(settings: Settings, ssettings: Settings, write) -> None:
    write("MEMORY.md", "# Memory\n- nothing here\n")
    write(KEY, jsonl(header(), message("user", "the pangolin plan")))
    assert settings.sources == ("memory",)
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.files_seen == 1 and search(index, "pangolin") == []
    assert index.status()["files_on_disk"] == 1 and index.status()["fresh"]
    index.close()

    on = MemoryIndex(ssettings)
    assert on.status()["pending_files"] == 1  # the transcript counts as a file waiting to be indexed
    on.sync()
    assert ranges(on, "pangolin") == [(KEY, 2, 2, "sessions")]
    status = on.status()
    assert (status["files_on_disk"], status["pending_files"], status["fresh"]) == (2, 0, True)
    on.close()

    off = MemoryIndex(settings)
    report = off.sync()
    assert report.removed == 1 and search(off, "pangolin") == []


def test_sources_parse_from_toml_and_the_environment(workspace: Path) -> None:
    (workspace / "clawmem.toml").write_text('sources = ["memory", "sessions"]\nsessions_dir = "logs/agent"\n')
    loaded = load_settings(workspace=workspace)
    assert (loaded.sources, loaded.sessions_dir) == (("memory", "sessions"), "logs/agent")
    from_env = load_settings(workspace=workspace, environ={"CLAWMEM_SOURCES": "Sessions, memory"})
    assert from_env.sources == ("sessions", "memory")
    with pytest.raises(ConfigError, match="sources"):
        load_settings(workspace=workspace, environ={"CLAWMEM_SOURCES": "memory,email"})


def test_transcripts_follow_the_path_rules(ssettings: Settings, write, workspace: Path, tmp_path: Path) -> None:
    """Recursive, keyed by workspace-relative path; `exclude` honoured; symlinks and hidden folders skipped."""
    write("sessions/agents/main/deep.jsonl", jsonl(header(), message("user", "ocelot deep")))
    write("sessions/private/secret.jsonl", jsonl(header(), message("user", "ocelot private")))
    write("sessions/.hidden/h.jsonl", jsonl(header(), message("user", "ocelot hidden")))
    write("sessions/notes.txt", "ocelot text")
    outside = tmp_path / "outside.jsonl"
    outside.write_text(jsonl(header(), message("user", "ocelot outside")))
    (workspace / "sessions" / "link.jsonl").symlink_to(outside)
    settings = load_settings(workspace=workspace, overrides={
        "index": str(ssettings.index_path), "embedding.provider": "none", "sources": ["memory", "sessions"],
        "exclude": ["sessions/private/**"]})
    index = MemoryIndex(settings)
    report = index.sync()
    assert {r[0] for r in ranges(index, "ocelot")} == {"sessions/agents/main/deep.jsonl"}
    assert "sessions/link.jsonl: symlink, not followed" in report.skipped


def test_an_absolute_sessions_dir_outside_the_workspace_gives_absolute_keys(ssettings: Settings, tmp_path: Path,
                                                                             workspace: Path) -> None:
    logs = tmp_path / "agent-logs"
    logs.mkdir()
    (logs / "s.jsonl").write_text(jsonl(header(), message("assistant", "the margay answer")))
    settings = load_settings(workspace=workspace, overrides={
        "index": str(ssettings.index_path), "embedding.provider": "none", "sources": ["sessions"],
        "sessions_dir": str(logs)})
    index = MemoryIndex(settings)
    index.sync()
    assert ranges(index, "margay") == [(str(logs / "s.jsonl"), 2, 2, "sessions")]


# -- appends, partial lines, rewrites ---------------------------------------------------------


def test_a_partial_last_line_waits_until_it_is_completed(ssettings: Settings, write, workspace: Path) -> None:
    done = jsonl(header(), message("user", "the first question about capybaras"))
    rest = json.dumps(message("assistant", "the tapir answer"))
    path = write(KEY, done + rest[:25])
    index = MemoryIndex(ssettings)
    index.sync()
    assert ranges(index, "capybaras") == [(KEY, 2, 2, "sessions")]
    assert search(index, "tapir") == []
    state = TailState.from_json(index.reader().file_row(KEY).state)  # type: ignore[union-attr]
    assert state is not None and (state.offset, state.lines) == (len(done.encode()), 2)
    assert index.status()["fresh"]  # nothing waits: the partial line is not a change to index yet

    with path.open("a") as fh:
        fh.write(rest[25:])  # the line is complete only with its newline
    index.sync()
    assert search(index, "tapir") == []
    with path.open("a") as fh:
        fh.write("\n")
    report = index.sync()
    assert ranges(index, "tapir") == [(KEY, 2, 3, "sessions")]  # one chunk with the question, as a whole read
    assert report.bytes_read <= len(rest) + 1 + 2 * SAMPLE_BYTES


def test_an_appended_line_is_indexed_without_reading_the_file_again(ssettings: Settings, write) -> None:
    bulky = {"type": "tool_result", "tool": "read", "output": {"text": "x" * 20_000}}
    lines: list[object] = [header()]
    for n in range(60):
        lines += [message("user", f"question {n} about the schedule"), bulky,
                  message("assistant", f"answer {n} about the schedule")]
    path = write(KEY, jsonl(*lines))
    index = MemoryIndex(ssettings)
    first = index.sync()
    size = path.stat().st_size
    assert size > 1_000_000 and first.bytes_read == size
    before = index.reader().execute("SELECT id, start_line, end_line, text FROM chunks ORDER BY seq")

    added = jsonl(message("assistant", "the kinkajou decision was final"))
    with path.open("a") as fh:
        fh.write(added)
    report = index.sync()
    assert report.bytes_read <= len(added) + 2 * SAMPLE_BYTES  # the new line and two 4 KiB samples
    assert report.bytes_read * 100 < size
    # The last chunk is made again with the new message (from the messages the state carries).
    assert (report.updated, report.chunks_added, report.chunks_removed) == (1, 1, 1)
    [(_, start, end, _)] = ranges(index, "kinkajou")
    assert start == before[-1][1] < end == len(lines) + 1
    after = index.reader().execute("SELECT id, start_line, end_line, text FROM chunks ORDER BY seq")
    assert after[:len(before) - 1] == before[:-1]  # earlier chunks untouched

    with path.open("a") as fh:  # lines with no conversation: read, nothing added
        fh.write(jsonl({"type": "model_change", "model": "m2"}))
    report = index.sync()
    assert (report.touched, report.chunks_added) == (1, 0) and report.bytes_read < 3 * SAMPLE_BYTES


def chunk_rows(index: MemoryIndex) -> list[tuple[int, int, str]]:
    return index.reader().execute("SELECT start_line, end_line, text FROM chunks ORDER BY start_line, end_line, seq")


def test_a_transcript_synced_after_every_line_is_chunked_as_one_read_of_it(ssettings: Settings, write,
                                                                          tmp_path: Path) -> None:
    lines: list[object] = [header()]
    for n in range(70):
        lines.append(message("user" if n % 2 else "assistant", f"turn{n} " + "words about the plan " * (2 + n % 9)))
        if n % 10 == 3:  # a message of many lines, cut inside, and one line longer than a window
            lines.append(message("assistant", "\n".join(f"step {k} of turn{n}: " + "detail " * 12 for k in range(40))))
            lines.append(message("user", f"turn{n} long " + "monolith " * 700))
        if n % 10 == 5:
            lines.append({"type": "tool_result", "tool": "read", "output": {"text": "x" * 3000}})
    path = write(KEY, jsonl(lines[0]))
    index = MemoryIndex(ssettings)
    index.sync()
    for line in lines[1:]:
        with path.open("a") as fh:
            fh.write(jsonl(line))
        index.sync()
    whole = MemoryIndex(load_settings(workspace=ssettings.workspace, overrides={
        "index": str(tmp_path / "whole.sqlite"), "embedding.provider": "none", "sources": ["memory", "sessions"]}))
    assert whole.sync().bytes_read == path.stat().st_size
    assert len(chunk_rows(whole)) > 20
    assert chunk_rows(index) == chunk_rows(whole)


def test_past_the_carry_limit_an_append_starts_a_new_chunk_and_loses_nothing(ssettings: Settings, write) -> None:
    huge = "the okapi said " + "rambling " * (CARRY_CHARS // 9 + 10)
    path = write(KEY, jsonl(header(), message("user", "a short question"), message("assistant", huge)))
    index = MemoryIndex(ssettings)
    index.sync()
    state = TailState.from_json(index.reader().file_row(KEY).state)  # type: ignore[union-attr]
    assert state is not None and state.carry == ()  # the last message alone is over the limit
    before = chunk_rows(index)
    with path.open("a") as fh:
        fh.write(jsonl(message("user", "and the quokka?")))
    report = index.sync()
    assert (report.chunks_added, report.chunks_removed) == (1, 0)
    assert chunk_rows(index) == [*before, (4, 4, "User: and the quokka?")]
    assert ranges(index, "okapi") and ranges(index, "quokka") == [(KEY, 4, 4, "sessions")]


def test_a_damaged_carry_is_never_trusted() -> None:
    good = TailState(10, 2, "h", "t", None, 0, (400, 80, "cl100k_base"), (Message(2, "User", "hi", None),))
    assert TailState.from_json(good.to_json()) == good
    data = json.loads(good.to_json())
    for carry in ([[2, "Tool", "hi", None]], [[9, "User", "hi", None]], [[2, "User", 5, None]],
                  [[2, "User", "a", None], [2, "User", "b", None]], [[True, "User", "hi", None]], "no", [[2]]):
        assert TailState.from_json(json.dumps({**data, "carry": carry})) is None, carry


def test_a_truncated_or_rewritten_transcript_is_reindexed_whole(ssettings: Settings, write) -> None:
    original = jsonl(header(), message("user", "the original serval story " + "padding " * 800),
                     message("assistant", "the original caracal reply"))
    path = write(KEY, original)
    index = MemoryIndex(ssettings)
    index.sync()
    assert ranges(index, "serval") and ranges(index, "caracal")

    shorter = jsonl(header(), message("user", "a shorter genet story"))
    path.write_text(shorter)
    report = index.sync()
    assert report.bytes_read == len(shorter)
    assert search(index, "serval") == [] and search(index, "caracal") == []
    assert ranges(index, "genet") == [(KEY, 2, 2, "sessions")]

    # Longer than before, but the start changed: not an append.
    rewritten = jsonl(header(), message("user", "a rewritten fossa story " + "padding " * 900),
                      message("assistant", "and a civet"))
    path.write_text(rewritten)
    report = index.sync()
    # Read whole, after the two samples that failed to match.
    assert len(rewritten) <= report.bytes_read <= len(rewritten) + 2 * SAMPLE_BYTES
    assert report.chunks_removed >= 1
    assert search(index, "genet") == []
    assert ranges(index, "civet")[0][2] == 3

    # Same head, but the bytes before the old offset changed (an edit of the last line): reindexed too.
    edited = rewritten.replace("and a civet", "and a binturong") + jsonl(message("user", "more"))
    path.write_text(edited)
    report = index.sync()
    assert len(edited) <= report.bytes_read <= len(edited) + 2 * SAMPLE_BYTES
    assert search(index, "civet") == [] and ranges(index, "binturong")


def test_a_stale_or_damaged_state_is_never_trusted(ssettings: Settings, write, tmp_path: Path) -> None:
    """Other chunking (a rebuild) or a state that does not parse: the transcript is read whole."""
    path = write(KEY, jsonl(header(), *[message("user", f"jackal line {n} " + "w " * 60) for n in range(20)]))
    index = MemoryIndex(ssettings)
    index.sync()
    chunks_400 = index.reader().execute("SELECT count(*) FROM chunks")[0][0]
    index.close()

    smaller = with_overrides(ssettings, chunking={"tokens": 100, "overlap": 10})
    rebuilt = MemoryIndex(smaller)
    with path.open("a") as fh:
        fh.write(jsonl(message("assistant", "the dhole")))
    report = rebuilt.sync()  # the fingerprint changed: a rebuild, which reads everything
    assert report.bytes_read == path.stat().st_size
    assert rebuilt.reader().execute("SELECT count(*) FROM chunks")[0][0] > chunks_400
    [(_, _, end, _)] = ranges(rebuilt, "dhole")
    assert end == 22
    rebuilt.close()

    writer = MemoryIndex(smaller)
    store = writer.reader()
    garbage = json.dumps({"v": STATE_VERSION, "offset": "garbage"})
    store.execute("UPDATE files SET state = ? WHERE path = ?", (garbage, KEY))
    with path.open("a") as fh:
        fh.write(jsonl(message("user", "the fennec")))
    report = writer.sync()
    assert report.bytes_read == path.stat().st_size
    assert len(ranges(writer, "dhole")) == 1  # its chunks were replaced, not indexed twice
    assert [r[2] for r in ranges(writer, "fennec")] == [23]


def test_get_refuses_a_transcript(ssettings: Settings, write) -> None:
    write(KEY, jsonl(header(), message("user", "hello")))
    index = MemoryIndex(ssettings)
    index.sync()
    with pytest.raises(PathError, match="session transcripts are searched, not read with `get`"):
        index.get(KEY)


# -- the watcher and the daemon ---------------------------------------------------------------


def test_the_watcher_names_transcripts_only_when_sessions_are_on(workspace: Path) -> None:
    transcript = str(workspace / "sessions" / "a.jsonl")
    on = WorkspaceWatcher(workspace, lambda reason, paths: None, sessions="sessions")
    off = WorkspaceWatcher(workspace, lambda reason, paths: None)
    assert on.affected(FileModifiedEvent(transcript)) == frozenset({"sessions/a.jsonl"})
    assert on.affected(FileModifiedEvent(str(workspace / "sessions" / "a.txt"))) == frozenset()
    assert on.affected(FileModifiedEvent(str(workspace / "sessions" / ".tmp" / "a.jsonl"))) == frozenset()
    assert on.affected(DirCreatedEvent(str(workspace / "sessions" / "agent"))) is None  # files may be inside
    assert on.affected(FileModifiedEvent(str(workspace / "memory" / "n.md"))) == frozenset({"memory/n.md"})
    assert off.affected(FileModifiedEvent(transcript)) == frozenset()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def test_the_daemon_makes_an_appended_line_searchable(workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    settings = daemon_settings(workspace, tmp_path, sock_dir, sources=["memory", "sessions"])

    def lines_of(client: DaemonClient, query: str) -> list[tuple[str, int]]:
        answer = client.search(SearchRequest(query, min_score=0.0, mode="bm25", source="sessions"))
        return [(r["path"], r["start_line"]) for r in answer["results"]]

    with running_daemon(settings) as daemon, DaemonClient(settings.socket_path).connect() as client:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        path = workspace / "sessions" / "live.jsonl"
        path.parent.mkdir()  # the folder appears after the daemon started
        path.write_text(jsonl(header(), message("user", "is the wolverine here?")))
        wait_until(lambda: lines_of(client, "wolverine") == [("sessions/live.jsonl", 2)], DEBOUNCE + BOUND,
                   message="a new transcript in a new sessions folder")
        with path.open("a") as fh:
            fh.write(jsonl(message("assistant", "the wolverine left at dawn, said the badger")))
        wait_until(lambda: lines_of(client, "badger") == [("sessions/live.jsonl", 2)], DEBOUNCE + BOUND,
                   message="an appended line, in one chunk with the question")
        assert lines_of(client, "wolverine") == [("sessions/live.jsonl", 2)]  # the old chunk was replaced
        assert client.status()["files_on_disk"] == 1


def test_a_lone_surrogate_in_a_transcript_stops_nothing(ssettings: Settings, write) -> None:
    """Valid JSON, unstorable text: the line is indexed with U+FFFD in its place, and every other file too."""
    write("MEMORY.md", "# Memory\nThe staging server is pinecone.\n")
    write(KEY, jsonl(header(), '{"type":"message","message":{"role":"user","content":"lone \\udc00 split emoji"}}',
                     '{"type":"message","message":{"role":"assistant","content":"a pair \\ud83d\\ude00 stays"}}',
                     message("user", "what about the tulips")))
    index = MemoryIndex(ssettings)
    report = index.sync()
    assert report.errors == [] and report.added == 2
    assert ranges(index, "pinecone") == [("MEMORY.md", 1, 2, "memory")]
    texts = [r["snippet"] for r in search(index, "tulips")]
    assert texts and "lone \ufffd split emoji" in texts[0] and "a pair \U0001f600 stays" in texts[0]
    write(KEY, jsonl(header(), '{"type":"message","message":{"role":"user","content":"lone \\udc00 again"}}',
                     message("assistant", "and marigolds")))
    assert index.sync().errors == []  # an existing index keeps syncing too
    assert ranges(index, "marigolds")[0][0] == KEY
    assert index.status()["fresh"]


def _bounded(ssettings: Settings, max_bytes: int) -> Settings:
    from dataclasses import replace

    return replace(ssettings, max_file_bytes=max_bytes)


def test_a_transcript_line_over_max_file_bytes_is_skipped_unheld_and_appends_still_read_only_their_bytes(
        ssettings: Settings, write) -> None:
    """One 5 MB line (a tool dumping a file into the conversation) with a 100 KB bound: it is reported and
    skipped, its bytes never held (a 50 MB line took the daemon to 344 MB), the messages around it indexed."""
    import tracemalloc

    from clawmem_index.text.tokens import get_encoding

    settings = _bounded(ssettings, 100_000)
    huge = message("assistant", "blob " * 1_000_000)
    path = write(KEY, jsonl(header(), message("user", "where is the wombat runbook"), huge,
                            message("assistant", "the wombat runbook is in the wiki")))
    index = MemoryIndex(settings)
    try:
        get_encoding("cl100k_base")  # the tokenizer's tables (~20 MB), loaded once per process: not the line's bytes
        tracemalloc.start()
        report = index.sync()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 2_000_000, peak
        assert report.skipped == [f"{KEY}: 1 transcript line larger than max_file_bytes (100,000 bytes) skipped"
                                  " (line 3); raise max_file_bytes (0: no limit) to index them"]
        assert [r[1:3] for r in ranges(index, "wombat runbook")] == [(2, 4)]
        with path.open("a") as fh:
            fh.write(jsonl(message("user", "and the kinkajou plan")))
        again = index.sync()
        assert again.bytes_read < 3 * SAMPLE_BYTES  # an append, not a read from the start
        assert ranges(index, "kinkajou")
        assert index.status()["fresh"] is True
    finally:
        index.close()


def test_a_transcript_larger_than_max_file_bytes_is_read_a_budget_at_a_time_and_whole(ssettings: Settings,
                                                                                     write) -> None:
    settings = _bounded(ssettings, 20_000)
    lines: list[object] = [header()]
    for n in range(400):
        lines.append(message("user" if n % 2 else "assistant", f"note {n} marmot{n} " + "filler " * 20))
    path = write(KEY, jsonl(*lines))
    assert path.stat().st_size > 5 * 20_000
    index = MemoryIndex(settings)
    try:
        report = index.sync()
        assert report.bytes_read >= path.stat().st_size and not report.skipped
        for n in (0, 199, 399):
            assert ranges(index, f"marmot{n}"), n
        status = index.status()
        assert status["fresh"] is True and status["pending_files"] == 0
        assert index.sync().bytes_read == 0  # and nothing is left to read
    finally:
        index.close()
