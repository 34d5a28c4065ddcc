from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clawmem_index.config import Settings


def clawmem(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "CLAWMEM_PROVIDER": "none", **(env or {})}
    return subprocess.run([sys.executable, "-m", "clawmem_index", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    target = tmp_path / "demo"
    out = clawmem("init", str(target))
    assert out.returncode == 0, out.stderr
    return target


def test_init_index_search_get_status_round_trip(ws: Path) -> None:
    out = clawmem("index", cwd=ws)
    assert out.returncode == 0, out.stderr
    assert "1 added" in out.stderr  # MEMORY.md: the starter templates are excluded
    assert "\r" not in out.stderr, "no progress bar when stderr is not a terminal"

    out = clawmem("search", "--json", "-n", "2", "which staging server", cwd=ws)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["results"][0]["path"] == "MEMORY.md"
    assert {"results", "provider", "model", "mode", "index"} <= answer.keys()
    assert len(answer["results"]) <= 2

    out = clawmem("search", "staging", "server", cwd=ws)
    assert out.returncode == 0 and "MEMORY.md:" in out.stdout

    out = clawmem("get", "MEMORY.md", "--from", "1", "--lines", "1", cwd=ws)
    assert out.returncode == 0 and out.stdout == "# MEMORY\n"
    out = clawmem("get", "MEMORY.md", "--from", "9999", cwd=ws)  # not silence and 0: how long the file is
    lines = len((ws / "MEMORY.md").read_text().splitlines())
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"clawmem: error: MEMORY.md has {lines} line(s): --from 9999 is past its end\n"

    out = clawmem("status", "--json", cwd=ws)
    status = json.loads(out.stdout)
    assert status["files_indexed"] == 1 and status["fresh"] is True

    out = clawmem("reindex", cwd=ws)
    assert out.returncode == 0, out.stderr


def test_global_options_work_on_every_command(ws: Path, tmp_path: Path) -> None:
    index = tmp_path / "elsewhere" / "idx.sqlite"
    assert clawmem("index", "--workspace", str(ws), "--index", str(index)).returncode == 0
    assert index.is_file()
    out = clawmem("search", "--workspace", str(ws), "--index", str(index), "--json", "Dana")
    assert json.loads(out.stdout)["results"]
    out = clawmem("status", "--json", env={"CLAWMEM_WORKSPACE": str(ws), "CLAWMEM_INDEX": str(index)})
    assert json.loads(out.stdout)["index_path"] == str(index)


def test_exit_codes(ws: Path, tmp_path: Path) -> None:
    assert clawmem("search", "anything", "--index", str(tmp_path / "none.sqlite"), cwd=ws).returncode == 3
    assert clawmem("index", cwd=ws).returncode == 0
    out = clawmem("get", "../secret.md", cwd=ws)
    assert out.returncode == 1 and "'..' is refused" in out.stderr
    out = clawmem("get", "memory/nope.md", cwd=ws)
    assert out.returncode == 1 and "no such memory file" in out.stderr
    assert clawmem("search", "--mode", "psychic", "x", cwd=ws).returncode == 2
    assert clawmem("frobnicate", cwd=ws).returncode == 2
    out = clawmem("search", "x", cwd=ws, env={"CLAWMEM_PROVIDER": "skynet"})
    assert out.returncode == 1 and "embedding.provider" in out.stderr
    out = clawmem("search", "   ", cwd=ws)
    assert out.returncode == 1 and "empty" in out.stderr


def test_init_dry_run_and_no_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "t"
    out = clawmem("init", "--dry-run", str(target))
    assert out.returncode == 0 and "would create" in out.stdout and not target.exists()
    target.mkdir()
    (target / "MEMORY.md").write_text("mine")
    out = clawmem("init", str(target))
    assert "kept existing" in out.stdout and (target / "MEMORY.md").read_text() == "mine"


def test_every_command_has_help() -> None:
    for command in ("init", "index", "search", "get", "status", "reindex"):
        out = clawmem(command, "--help")
        assert out.returncode == 0 and "Usage:" in out.stdout


def test_progress_bar_when_asked_for(ws: Path) -> None:
    out = clawmem("index", "--progress", cwd=ws)
    assert out.returncode == 0 and "indexing" in out.stderr



def test_flags_a_running_daemon_does_not_share_are_honoured_and_said(ws: Path, tmp_path: Path) -> None:
    """`--provider openai` with a keyword-only daemon running: answered here as asked, with a note on stderr."""
    from daemon_helpers import short_dir, spawn_daemon, stop_process, wait_listening

    index = tmp_path / "index.sqlite"
    assert clawmem("index", "--workspace", str(ws), "--index", str(index)).returncode == 0
    for sock_dir in short_dir():
        sock = sock_dir / "d.sock"
        daemon = spawn_daemon(ws, sock, index)
        try:
            wait_listening(sock, daemon)
            where = ["--workspace", str(ws), "--index", str(index), "--socket", str(sock)]
            same = clawmem("status", "--json", *where)
            assert json.loads(same.stdout)["daemon"]["pid"] == daemon.pid and "note" not in same.stderr
            other = clawmem("status", "--json", *where, "--provider", "openai")
            answer = json.loads(other.stdout)
            assert "daemon" not in answer and answer["configured_provider"] == "unavailable"
            assert f"the daemon of this workspace (pid {daemon.pid}) was not asked" in other.stderr
            assert "it uses provider none, not openai" in other.stderr
            found = clawmem("search", "--mode", "bm25", *where, "--provider", "openai", "staging")
            assert found.returncode == 0 and "was not asked" in found.stderr
            # The daemon would not rebuild for another provider: status says so instead of "the next sync".
            local = json.loads(clawmem("status", "--json", *where, "--provider", "local").stdout)
            assert any("will not rebuild" in reason for reason in local["stale_reasons"]), local["stale_reasons"]
            assert not any("the next sync rebuilds it" in reason for reason in local["stale_reasons"])
            # A write it would do with its own provider is refused with the reason, not handed to it.
            for command, provider in (("index", "local"), ("reindex", "openai")):
                refused = clawmem(command, *where, "--provider", provider)
                assert refused.returncode == 3 and "Traceback" not in refused.stderr, refused.stderr
                assert f"it uses provider none, not {provider}" in refused.stderr and "stop it" in refused.stderr
            handed = clawmem("index", *where, "--provider", "none")
            assert handed.returncode == 0 and "the daemon synced the index" in handed.stderr
        finally:
            stop_process(daemon)


def test_status_check_exit_codes(ws: Path, tmp_path: Path) -> None:
    """0 fresh, 3 no index, 4 pending work, 5 cannot catch up (here: the configured provider cannot start)."""
    where = ["--workspace", str(ws), "--index", str(tmp_path / "i.sqlite"), "--socket", str(tmp_path / "none.sock")]

    def check(*extra: str) -> int:
        out = clawmem("status", "--check", *where, *extra)
        assert "Traceback" not in out.stderr
        return out.returncode

    assert check() == 3
    assert clawmem("index", *where).returncode == 0
    assert check() == 0
    assert clawmem("status", *where).returncode == 0  # without --check, status is only printed
    (ws / "memory" / "2026-11-24.md").write_text("# Today\n- a new note\n")
    assert check() == 4
    assert clawmem("index", *where).returncode == 0 and check() == 0
    assert check("--provider", "openai") == 5  # no key: it cannot start, so it cannot catch up
    assert check("--json") == 0


def test_the_progress_bar_redraws_a_few_times_a_second_and_measures_before_it_tells() -> None:
    from clawmem_index.cli.writing import _ProgressBar

    now = [100.0]
    with _ProgressBar(True, "indexing", "files", clock=lambda: now[0]) as bar:
        assert bar._status(1) is None
        for done in range(1, 1001):  # 1,000 files in 0.5 s: two redraws a second at most, and the last one
            now[0] += 0.0005
            bar.update(done, 2000)
        assert bar.draws <= 4
        assert bar._status(1000) is None, "half a second is not enough to tell a rate or the time left"
        now[0] += 0.6  # 1.1 s since the start
        bar.update(1001, 2000)
        assert bar._status(1001) == "910 files/s, 0:01 left"
        bar.update(2000, 2000)
        assert bar._drawn == 2000, "the end is always drawn"


def test_a_count_that_starts_again_gets_a_bar_of_its_own() -> None:
    from clawmem_index.cli.writing import _ProgressBar

    now = [100.0]
    with _ProgressBar(True, "embedding", "chunks", clock=lambda: now[0]) as bar:
        bar.update(13104, 13104)  # a rebuild's vectors taken from the old index
        first = bar._bar
        now[0] += 2.0
        bar.update(5, 40)  # then the few the cache or the provider gives
        assert bar._bar is not first and first.finished
        assert (bar._bar.length, bar._drawn, bar._bar.pos) == (40, 5, 5)
        now[0] += 1.0
        bar.update(20, 40)
        assert bar._status(20) == "20 chunks/s, 0:01 left", "the rate is the new count's"


def test_search_explain_on_the_command_line(ws: Path) -> None:
    assert clawmem("index", cwd=ws).returncode == 0
    out = clawmem("search", "--explain", "--mode", "bm25", "staging", "server", cwd=ws)
    assert out.returncode == 0 and "(keyword #1 1.000, vector -, bm25 1.000)" in out.stdout
    data = json.loads(clawmem("search", "--json", "--explain", "--mode", "bm25", "staging", cwd=ws).stdout)
    assert data["results"][0]["explain"]["keyword_rank"] == 1


def test_search_says_how_it_read_the_query(ws: Path) -> None:
    (ws / "memory" / "2026-11-24.md").write_text("# Log\n- moved the staging server to zephyr\n")
    assert clawmem("index", cwd=ws).returncode == 0
    for command in ("search", "context"):
        out = clawmem(command, "--now", "2026-11-25", "stagng", "yesterday", cwd=ws)
        assert out.returncode == 0, out.stderr
        assert "clawmem: note: read 'yesterday' as 2026-11-24 (notes dated near it first)" in out.stderr
        assert "clawmem: note: read 'stagng' as 'staging'" in out.stderr
    out = clawmem("search", "--explain", "--now", "2026-11-25", "staging", "yesterday", cwd=ws)
    assert "memory/2026-11-24.md" in out.stdout.splitlines()[0] and ", date 1.00," in out.stdout
    bad = clawmem("search", "--now", "tomorrow-ish", "staging", cwd=ws)
    assert bad.returncode != 0 and "'now' must be an ISO date" in bad.stderr and "Traceback" not in bad.stderr


def test_a_search_says_what_its_answer_does_not_cover_yet(ws: Path) -> None:
    assert clawmem("index", cwd=ws).returncode == 0
    out = clawmem("search", "staging", "server", cwd=ws)
    assert out.returncode == 0 and "MEMORY.md:" in out.stdout and "since the last sync" not in out.stderr
    (ws / "memory" / "2026-11-26.md").write_text("# Today\n- moved staging to zephyr\n")
    for command in (["search", "staging", "server"], ["context", "staging", "server"]):
        out = clawmem(*command, cwd=ws)
        assert out.returncode == 0, out.stderr
        assert "clawmem: note: 1 file(s) changed since the last sync: not in this answer yet" in out.stderr
        assert "wait for a vector" not in out.stderr  # a keyword-only index has no vectors to wait for



# -- exits while the local model computes: the real CLI, the real model --------------------------

LONG_QUERY = ("staging server deploy zephyr " * 3000).split()
"""A query whose vector takes the local model several decodes (it is read as its first 8,192 characters:
about 0.5 s on 2 cores): past its 0.1 s deadline, the thread that embeds it is still in llama.cpp when the
command ends."""
RESUMES = "clawmem: interrupted: the files and vectors indexed so far are kept; the next `clawmem index` resumes" \
          " where this one stopped"


def local(model: Path) -> dict[str, str]:
    return {"CLAWMEM_PROVIDER": "local", "CLAWMEM_LOCAL_MODEL": str(model)}


@pytest.mark.slow
def test_a_search_whose_query_vector_missed_its_deadline_exits_0_with_its_answer(ws: Path, local_model: Path,
                                                                                 tmp_path: Path) -> None:
    """It printed its keyword answer, then crashed in exit() (139) under the query's decode, 2 runs in 5.

    The deadline falls after the model's load (a process that ends during the load ends before the
    first decode) and well inside the query's decodes.
    """
    env = local(local_model)
    assert clawmem("index", cwd=ws, env=env).returncode == 0
    config = tmp_path / "clawmem.toml"
    config.write_text("[search]\nquery_timeout = 0.1\n")
    for _ in range(8):
        out = clawmem("search", "--config", str(config), *LONG_QUERY, cwd=ws, env=env)
        assert out.returncode == 0, out.stderr
        assert "did not answer within 0.1 s" in out.stderr, "the query vector must still be in the making at exit"
        assert "MEMORY.md:" in out.stdout


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_during_index_exits_130_and_the_next_index_resumes(tmp_path: Path, local_model: Path) -> None:
    """Ctrl-C while the vectors are made: exit 130 and one line saying the next run resumes (it was click's
    `Aborted!` and 1, or a crash in exit() under a decode, 1 run in 5), and each run keeps what it embedded.
    A second Ctrl-C while it winds up changes nothing."""
    ws = tmp_path / "notes"
    (ws / "memory").mkdir(parents=True)
    for n in range(600):
        (ws / "memory" / f"note-{n:03}.md").write_text(f"- note {n}: the {('kiln', 'heron', 'lathe')[n % 3]} moved\n")
    env = {**os.environ, **local(local_model), "CLAWMEM_INDEX": str(tmp_path / "index.sqlite")}
    waiting = []
    for _ in range(4):
        # SIGINT handled as a terminal's Ctrl-C reaches a foreground `clawmem index`: a suite started as a background
        # job (`cmd &`) runs with SIGINT ignored, which its children inherit (Python then keeps it ignored)
        with subprocess.Popen([sys.executable, "-m", "clawmem_index", "index", "--progress"], cwd=ws, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, preexec_fn=_default_sigint) as proc:
            try:
                assert proc.stderr is not None
                # The embedding bar's label comes with the first batch of vectors stored: more are in the making.
                seen = next((line for line in iter(proc.stderr.readline, "") if line.startswith("embedding")), None)
                proc.send_signal(signal.SIGINT)
                said = next((line for line in iter(proc.stderr.readline, "") if line.startswith("clawmem:")), "")
                proc.send_signal(signal.SIGINT)  # impatient: again while it winds up
                rest = said + proc.stderr.read()
                code = proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
        assert seen is not None, "embedding never started"
        assert code == 130, rest
        assert rest.splitlines()[-1] == RESUMES
        status = clawmem("status", "--json", cwd=ws, env=env)
        waiting.append(json.loads(status.stdout)["pending_embeddings"])
    assert waiting == sorted(set(waiting), reverse=True) and waiting[-1] > 0, f"each run resumes: {waiting}"


def test_an_interrupt_says_whether_the_index_in_use_changed(settings: Settings, write) -> None:
    """A sync commits each file (and each batch of vectors) as done; a rebuild is put in place whole or not at all."""
    from clawmem_index.cli.writing import _where_it_stopped
    from clawmem_index.engine.core import MemoryIndex

    def ctrl_c(done: int, total: int) -> None:
        raise KeyboardInterrupt

    write("MEMORY.md", "# Memory\n- the staging server is kiln\n")
    index = MemoryIndex(settings)
    with pytest.raises(KeyboardInterrupt):
        index.sync(progress=ctrl_c)  # the first index is written in place: what it committed is kept
    assert not index.rebuilding and index.backend.exists()
    assert "clawmem: " + _where_it_stopped(index.rebuilding, force=False) == RESUMES
    assert _where_it_stopped(True, force=False).endswith(
        "the index in use is as it was; the next `clawmem index` starts it again")
    index.sync()
    assert not index.rebuilding
    write("memory/2026-11-24.md", "# Today\n- heron\n")
    with pytest.raises(KeyboardInterrupt):
        index.reindex(progress=ctrl_c)
    assert index.rebuilding
    assert _where_it_stopped(index.rebuilding, force=True).endswith("`clawmem reindex` starts it again")
    with pytest.raises(KeyboardInterrupt):
        index.sync(progress=ctrl_c)
    assert not index.rebuilding and "clawmem: " + _where_it_stopped(index.rebuilding, force=False) == RESUMES
    index.close()


@pytest.mark.parametrize(("asked", "folded"), [("ALPHA", "alpha"), ("ünï-名前", "n"), (" alpha", "alpha"),
                                               ("a" * 64, "a" * 63), ("my notes", "my-notes")])
def test_grant_refuses_a_name_the_index_would_fold_and_says_what_it_would_be(asked: str, folded: str) -> None:
    """`grant beta ALPHA` granted tenant 'alpha', and 'ünï-名前' became 'n': a name is granted only as written."""
    out = clawmem("grant", "beta", asked, "--url", "postgresql://nobody@127.0.0.1:1/none")  # never connected to
    assert out.returncode == 1, out.stderr
    assert "is not a workspace name" in out.stderr and repr(folded) in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_ctrl_c_while_a_model_load_has_silenced_stderr_still_says_what_it_kept() -> None:
    """llama-cpp-python points fd 2 and sys.stderr at /dev/null while a model loads (on the embedding thread during
    `clawmem index`): a Ctrl-C then exited 130 with no message, one run in 8. The line goes to the stderr taken at
    start."""
    pytest.importorskip("llama_cpp")
    program = ("from llama_cpp._utils import suppress_stdout_stderr\n"
               "from clawmem_index.cli.base import interrupted\n"
               "suppress_stdout_stderr(disable=False).__enter__()  # a load in flight on another thread\n"
               "interrupted('interrupted: the files and vectors indexed so far are kept')\n")
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130
    assert out.stderr == "clawmem: interrupted: the files and vectors indexed so far are kept\n"
