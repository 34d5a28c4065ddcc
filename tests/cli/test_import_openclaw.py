"""`clawmem import-openclaw`: OpenClaw's memory-search settings carried into clawmem.toml, and every one it cannot
carry named; the written file is one clawmem loads, and no key is ever written into it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from clawmem_index.cli import cli
from clawmem_index.cli.openclaw_settings import import_settings, memory_search_settings
from clawmem_index.config import load_settings

CONFIG = """// OpenClaw's config is JSON5: comments, trailing commas, unquoted keys.
{
  memorySearch: { provider: "gemini", model: "old-model" },  // legacy, overridden below
  memory: {
    search: {
      provider: "openai",
      model: "text-embedding-3-small",
      remote: { baseUrl: "http://127.0.0.1:8080/v1", apiKey: "${MY_OPENAI_KEY}", headers: { "X-Team": "a" } },
      query: { maxResults: 8, minScore: 0.35 },
      extraPaths: ["../notes"],
    },
  },
  agents: {
    defaults: { workspace: "WS_DEFAULT" },
    entries: {
      coder: { workspace: "WS_CODER", memory: { search: { provider: "voyage", model: "voyage-3",
                                                          sources: ["memory", "sessions"] } } },
    },
  },
}
"""


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "openclaw.json"
    path.write_text(CONFIG.replace("WS_DEFAULT", str(tmp_path / "ws")).replace("WS_CODER", str(tmp_path / "coder")))
    return path


def test_the_shared_settings_are_carried_and_the_rest_named(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "ws").mkdir()
    out = CliRunner().invoke(cli, ["import-openclaw", "--openclaw-config", str(config), "--write"])
    assert out.exit_code == 0, out.output
    written = (tmp_path / "ws" / "clawmem.toml").read_text()
    assert 'provider = "openai"' in written and 'base_url = "http://127.0.0.1:8080/v1"' in written
    assert "max_results = 8" in written and '"X-Team" = "a"' in written
    assert "MY_OPENAI_KEY" not in written and "api_key" not in written
    settings = load_settings(workspace=tmp_path / "ws", environ={})
    assert (settings.embedding.provider, settings.embedding.model) == ("openai", "text-embedding-3-small")
    assert settings.embedding.headers == {"X-Team": "a"} and settings.search.max_results == 8
    notes = out.stderr
    assert "give it to clawmem's daemon as OPENAI_API_KEY" in notes and "MY_OPENAI_KEY" in notes
    assert "query.minScore is not carried" in notes and "extraPaths are not carried" in notes


def test_an_agent_s_own_settings_win_and_its_workspace_is_the_target(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "coder").mkdir()
    out = CliRunner().invoke(cli, ["import-openclaw", "--openclaw-config", str(config), "--agent", "coder", "--write"])
    assert out.exit_code == 0, out.output
    settings = load_settings(workspace=tmp_path / "coder", environ={})
    assert (settings.embedding.provider, settings.embedding.model) == ("voyage", "voyage-3")
    assert list(settings.sources) == ["memory", "sessions"]
    assert "sessions_dir" in out.stderr


def test_an_existing_clawmem_toml_is_never_overwritten(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "clawmem.toml").write_text("# mine\n")
    out = CliRunner().invoke(cli, ["import-openclaw", "--openclaw-config", str(config), "--write"])
    assert out.exit_code != 0
    assert "exists and is left as it is" in out.stderr and "Traceback" not in out.output
    assert (tmp_path / "ws" / "clawmem.toml").read_text() == "# mine\n"


@pytest.mark.parametrize("text, message", [
    ("{ memory: { search: ", "is not valid JSON5"),
    ("[1, 2]", "is not an object"),
    ('{"memory": {"search": {"remote": {"headers": {"X-A": "\\ud800"}}}}}', "not text at memory.search.remote"),
    ('{a: 1, /* JSON5 */ "b": "\\udfff"}', "not text at b"),
    ("{a:" * 10_000 + "1" + "}" * 10_000, "nested too deeply"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("{" + ",".join(f"k{i}: {i}" for i in range(200_000)) + "}", "more than an OpenClaw config holds"),
    ("// " + "x" * (21 << 20) + "\n{}", "more than an OpenClaw config holds"),
    (b"{\"a\": \"\xff\"}", "is not UTF-8 text"),
])
def test_a_broken_config_is_one_line(tmp_path: Path, text: str | bytes, message: str) -> None:
    path = tmp_path / "openclaw.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    out = subprocess.run([sys.executable, "-m", "clawmem_index", "import-openclaw", "--openclaw-config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    """A FIFO with no writer, /dev/zero or a folder: one line at once, where reading would hang or never end."""
    import os

    path = tmp_path / "openclaw.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    else:
        path.mkdir()
    env = {**os.environ, "OPENCLAW_CONFIG_PATH": str(path)}
    out = subprocess.run([sys.executable, "-m", "clawmem_index", "import-openclaw"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "is not a regular file" in out.stderr or "cannot read OpenClaw's config" in out.stderr


def test_an_include_is_named_as_not_followed(tmp_path: Path) -> None:
    config = tmp_path / "openclaw.json"
    config.write_text('{"$include": "./more.json5", "memory": {"search": {"provider": "openai", '
                      '"$include": "./search.json5"}}}')
    out = CliRunner().invoke(cli, ["import-openclaw", "--openclaw-config", str(config)])
    assert out.exit_code == 0, out.output
    assert "$include at the top level is not followed" in out.stderr
    assert "$include at memory.search is not followed" in out.stderr


def test_a_missing_config_names_it(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["import-openclaw", "--openclaw-config", str(tmp_path / "none.json")])
    assert out.exit_code != 0 and "cannot read OpenClaw's config" in out.stderr


@pytest.mark.parametrize("search, expected, note", [
    ({"provider": "ollama", "remote": {"baseUrl": "http://127.0.0.1:11434/v1"}, "model": "nomic-embed-text"},
     {"provider": "openai", "base_url": "http://127.0.0.1:11434/v1", "model": "nomic-embed-text"}, None),
    ({"provider": "lmstudio"}, {"provider": "openai"}, "set embedding.base_url"),
    ({"provider": "github-copilot"}, {}, "has no clawmem counterpart"),
    ({"provider": "openai", "remote": {"apiKey": "sk-literal"}}, {"provider": "openai"},
     "the key is written in OpenClaw's config"),
    ({"provider": "gemini", "remote": {"apiKey": {"source": "env", "provider": "default", "id": "GEMINI_API_KEY"}}},
     {"provider": "gemini"}, "the key stays in GEMINI_API_KEY"),
    ({"provider": "local", "local": {"modelPath": "/models/e.gguf"}, "fallback": "none"},
     {"provider": "local", "local_model": "/models/e.gguf", "fallback": "none"}, None),
    ({}, {"provider": "openai"}, "clawmem reads the key from OPENAI_API_KEY"),
])
def test_providers_map_to_clawmem_s(search: dict, expected: dict, note: str | None) -> None:
    imported = import_settings(search, {})
    assert imported.settings.get("embedding", {}) == expected
    if note:
        assert any(note in n for n in imported.notes), imported.notes
    assert "sk-literal" not in imported.toml()


def test_legacy_and_per_agent_layers_merge_in_openclaw_s_order() -> None:
    config = {"memorySearch": {"provider": "gemini", "extraPaths": ["a"]},
              "agents": {"defaults": {"memorySearch": {"model": "m1"}},
                         "entries": {"x": {"memorySearch": {"extraPaths": "b"},
                                           "memory": {"search": {"model": "m2"}}}}},
              "memory": {"search": {"query": {"maxResults": 3}}}}
    merged = memory_search_settings(config, "x")
    assert (merged["provider"], merged["model"], merged["extraPaths"]) == ("gemini", "m2", ["a", "b"])
    assert memory_search_settings(config, None)["model"] == "m1"
