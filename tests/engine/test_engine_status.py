"""`status` tells the truth: never fresh while anything waits or failed, readable times, a private index."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clawmem_index.config import Settings, load_settings, with_overrides
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ConfigError
from clawmem_index.search.ranking import SearchRequest

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def clawmem(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawmem_index", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "CLAWMEM_PROVIDER": "none", **env})


def test_fresh_means_nothing_waits_and_every_reason_is_named(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha\n")
    provider = FakeProvider(dims=8, fail=True)
    index = MemoryIndex(settings, provider=provider)
    report = index.sync()
    assert report.embed_error is not None
    status = index.status()
    assert status["fresh"] is False and status["pending_embeddings"] == 1
    assert status["stale_reasons"] == ["1 chunk wait for a vector", "embedding failed: fake provider is down"]
    provider.fail = False
    index.sync()
    status = index.status()
    assert status["fresh"] is True and status["stale_reasons"] == []
    assert ISO.match(str(status["last_sync_at"]))
    duration = status["last_sync_duration"]
    assert isinstance(duration, float) and duration == round(duration, 3)
    write("memory/b.md", "# B\nbeta\n")
    assert index.status()["stale_reasons"] == ["1 file changed since the last sync"]
    index.close()


def test_another_configured_provider_is_not_fresh(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha\n")
    MemoryIndex(settings, provider=FakeProvider(dims=8, model="old")).sync()
    index = MemoryIndex(settings, provider=FakeProvider(dims=8, model="new"))
    status = index.status()
    assert status["fresh"] is False and status["configured_provider"] == "fake/new"
    assert any("built with fake/old" in reason for reason in status["stale_reasons"])
    index.close()


def test_the_same_model_under_other_settings_says_what_differs(settings: Settings, write: Any) -> None:
    """Not "built with fake/m, not fake/m": a new model file, window, server or vector size changes
    the identity but not the name (the local model's window did, when it came)."""
    write("memory/a.md", "# A\nalpha\n")
    MemoryIndex(settings, provider=FakeProvider(dims=8, model="m")).sync()
    index = MemoryIndex(settings, provider=FakeProvider(dims=16, model="m"))
    reasons = index.status()["stale_reasons"]
    assert "the index was built with fake/m under other settings (its vector size differs: another model file," \
           " window, server or size): the next sync rebuilds it" in reasons
    warning = index.search(SearchRequest("alpha"))["warning"]
    assert warning.startswith("the index was built with fake/m under other settings (its vector size differs")
    assert warning.endswith("keyword results only until the next sync rebuilds it")
    index.close()
    MemoryIndex(settings).sync()  # keyword only ("none", no model): named without a slash
    index = MemoryIndex(settings, provider=FakeProvider(dims=8, model="m"))
    assert "the index was built with none, not the configured fake/m: the next sync rebuilds it" in \
        index.status()["stale_reasons"]
    index.close()


def test_a_failed_sync_is_remembered_until_one_succeeds(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha\n")
    MemoryIndex(settings).sync()
    broken = with_overrides(settings, embedding={"provider": "openai"})  # no key: cannot start
    with pytest.raises(Exception, match="OPENAI_API_KEY"):
        MemoryIndex(broken).sync()
    status = MemoryIndex(settings).status()
    assert status["fresh"] is False and "OPENAI_API_KEY" in str(status["last_error"])
    MemoryIndex(settings).sync()
    status = MemoryIndex(settings).status()
    assert status["fresh"] is True and status["last_error"] is None


def test_an_empty_workspace_is_never_called_fresh(settings: Settings) -> None:
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.files_seen == 0
    status = index.status()
    assert status["fresh"] is False and "no memory files" in status["stale_reasons"][0]
    index.close()


def test_a_missing_workspace_is_an_error_and_its_index_is_kept(settings: Settings, write: Any, tmp_path: Path) -> None:
    """An unmounted or mistyped workspace must not empty the index as if every note were deleted."""
    write("memory/a.md", "# A\nalpha\n")
    MemoryIndex(settings).sync()
    gone = with_overrides(settings)
    object.__setattr__(gone, "workspace", tmp_path / "not-there")
    with pytest.raises(ConfigError, match="does not exist"):
        MemoryIndex(gone).sync()
    assert MemoryIndex(settings).status()["files_indexed"] == 1


def test_the_cli_refuses_a_wrong_workspace_and_warns_on_an_empty_one(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for command in (["index"], ["search", "x"], ["status"], ["get", "MEMORY.md"]):
        out = clawmem(*command, "--workspace", str(missing))
        assert out.returncode == 1 and "does not exist" in out.stderr and "Traceback" not in out.stderr
    a_file = tmp_path / "file.md"
    a_file.write_text("not a folder")
    out = clawmem("index", "--workspace", str(a_file))
    assert out.returncode == 1 and "is not a directory" in out.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    out = clawmem("index", "--workspace", str(empty), "--index", str(tmp_path / "i.sqlite"))
    assert out.returncode == 0 and "no memory files here" in out.stderr
    status = json.loads(clawmem("status", "--json", "--workspace", str(empty), "--index",
                                str(tmp_path / "i.sqlite")).stdout)
    assert status["fresh"] is False


def test_status_text_is_for_people(template_workspace: Path, tmp_path: Path) -> None:
    flags = ["--workspace", str(template_workspace), "--index", str(tmp_path / "i.sqlite")]
    out = clawmem("status", *flags)
    assert out.returncode == 0 and "None" not in out.stdout and "stale_reasons" in out.stdout
    assert "no index yet" in out.stdout
    assert clawmem("index", *flags).returncode == 0
    out = clawmem("status", *flags)
    assert "None" not in out.stdout and "True" not in out.stdout and "False" not in out.stdout
    assert re.search(r"last_sync_at\s+\d{4}-\d\d-\d\dT", out.stdout)
    assert re.search(r"fresh\s+yes", out.stdout)


def test_the_summary_counts_the_whole_run_and_embedding_progress_moves_per_batch(settings: Settings,
                                                                                 write: Any) -> None:
    for i in range(150):
        write(f"memory/n{i}.md", f"# Note {i}\nword{i}\n")
    timed = TimedProvider()
    index = MemoryIndex(settings, provider=timed)
    seen: list[tuple[int, int]] = []
    report = index.sync(embed_progress=lambda done, total: seen.append((done, total)))
    assert report.embedded == 150
    assert seen == [(16, 150), (80, 150), (144, 150), (150, 150)]  # one step per provider batch, the first small
    assert report.duration >= timed.busy > 0  # the embedding is inside the reported time
    index.close()


class TimedProvider(FakeProvider):
    """Counts how long its calls take, so a test can compare that with the run's reported duration."""

    def __init__(self) -> None:
        super().__init__(dims=8)
        self.busy = 0.0

    def embed_documents(self, texts: Any) -> list[list[float]]:
        import time

        started = time.perf_counter()
        try:
            return super().embed_documents(texts)
        finally:
            self.busy += time.perf_counter() - started


def test_the_default_index_location_is_private_even_when_an_older_version_left_it_open(workspace: Path,
                                                                                     write: Any) -> None:
    write("MEMORY.md", "# Memory\nsecret plans\n")
    settings = load_settings(workspace=workspace, overrides={"embedding.provider": "none"})
    folder = settings.index_path.parent
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    os.chmod(settings.cache_dir, 0o755)
    settings.index_path.touch(mode=0o644)
    os.chmod(settings.index_path, 0o644)
    MemoryIndex(settings).sync()
    modes = {p: oct(stat.S_IMODE(p.stat().st_mode)) for p in (settings.cache_dir, folder, settings.index_path)}
    assert modes == {settings.cache_dir: "0o700", folder: "0o700", settings.index_path: "0o600"}


def test_what_a_sync_left_out_is_counted_in_status(settings: Settings, write: Any, workspace: Path) -> None:
    write("memory/a.md", "# A\nalpha\n")
    os.mkfifo(workspace / "memory" / "pipe.md")
    os.symlink("/etc/hostname", workspace / "memory" / "link.md")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 1
    status = index.status()
    assert status["last_sync_problem_count"] == 2
    assert sorted(status["last_sync_problems"]) == ["memory/link.md: symlink, not followed",
                                                    "memory/pipe.md: not a regular file (FIFO)"]
    index.close()


def test_status_names_the_configured_provider_before_the_first_build(settings: Settings, write: Any) -> None:
    """A client compares it with the provider it asks for: unnamed, it would bypass a daemon still building."""
    write("memory/a.md", "# A\nalpha\n")
    status = MemoryIndex(settings, provider=FakeProvider(dims=8)).status()
    assert status["index_exists"] is False
    assert status["configured_provider"] == f"fake/{FakeProvider(dims=8).info.model}"
