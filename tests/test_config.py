from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from clawmem_index.config import Settings, as_dict, load_settings
from clawmem_index.errors import ConfigError


def test_defaults_match_the_spec(tmp_path: Path) -> None:
    s = load_settings(workspace=tmp_path, environ={})
    assert (s.chunking.tokens, s.chunking.overlap, s.chunking.tokenizer) == (400, 80, "cl100k_base")
    assert (s.search.max_results, s.search.min_score, s.search.candidate_multiplier) == (6, 0.2, 4)
    assert (s.search.vector_weight, s.search.text_weight, s.search.rrf_k) == (0.6, 0.4, 60)
    assert s.embedding.provider == "auto" and s.embedding.cache_max_entries == 50_000
    assert s.daemon.debounce == 1.5
    assert s.index_path.name == "index.sqlite" and tmp_path not in s.index_path.parents


def test_toml_then_env_then_flags(tmp_path: Path) -> None:
    (tmp_path / "clawmem.toml").write_text('[search]\nmax_results = 9\nmode = "bm25"\n'
                                           '[embedding]\nprovider = "openai"\n')
    s = load_settings(workspace=tmp_path, environ={})
    assert (s.search.max_results, s.search.mode, s.embedding.provider) == (9, "bm25", "openai")
    s = load_settings(workspace=tmp_path, environ={"CLAWMEM_PROVIDER": "none"})
    assert s.embedding.provider == "none" and s.search.max_results == 9
    s = load_settings(workspace=tmp_path, environ={"CLAWMEM_PROVIDER": "none"},
                      overrides={"embedding.provider": "voyage", "search.max_results": 3})
    assert (s.embedding.provider, s.search.max_results) == ("voyage", 3)


def test_relative_paths_in_the_file_are_from_its_folder_and_others_from_the_current_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative `socket` in clawmem.toml names one place whoever reads the file (a CLI run from any
    folder, the daemon, the OpenClaw plugin); one from the environment is the caller's own."""
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    ws.mkdir()
    elsewhere.mkdir()
    (ws / "clawmem.toml").write_text('socket = "run/ws.sock"\nindex = "~/idx.sqlite"\n')
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HOME", str(tmp_path))
    s = load_settings(workspace=ws, environ={})
    assert (s.socket_path, s.index_path) == (ws / "run" / "ws.sock", tmp_path / "idx.sqlite")
    s = load_settings(workspace=ws, environ={"CLAWMEM_SOCKET": "mine.sock"})
    assert s.socket_path == elsewhere / "mine.sock"


def test_fixed_environment_names(tmp_path: Path) -> None:
    env = {"CLAWMEM_WORKSPACE": str(tmp_path), "CLAWMEM_INDEX": str(tmp_path / "i.db"),
           "CLAWMEM_SOCKET": str(tmp_path / "s.sock"), "CLAWMEM_MODEL": "m", "CLAWMEM_LOCAL_MODEL": "/x.gguf",
           "CLAWMEM_FALLBACK": "none", "CLAWMEM_LOG_LEVEL": "debug", "CLAWMEM_PROVIDER": "local"}
    s = load_settings(environ=env)
    assert s.workspace == tmp_path.resolve()
    assert s.index_path == tmp_path / "i.db" and s.socket_path == tmp_path / "s.sock"
    assert (s.embedding.model, s.embedding.local_model, s.log_level, s.embedding.provider) == ("m", "/x.gguf", "debug",
                                                                                                "local")


@pytest.mark.parametrize("toml, key", [
    ("bogus = 1\n", "bogus"),
    ("[search]\nmax_result = 5\n", "search.max_result"),
    ("[search]\nmax_results = 'many'\n", "search.max_results"),
    ("[search]\nmin_score = 3.0\n", "search.min_score"),
    ("[chunking]\noverlap = 500\n", "chunking.overlap"),
    ("[embedding]\nprovider = 'skynet'\n", "embedding.provider"),
    ("[embedding]\nprecision = 'int4'\n", "embedding.precision"),
    ("[embedding]\nlocal_window = 8\n", "embedding.local_window"),
    ("index_backend = 'postgres'\nindex_url = 'postgresql://u@h/db'\n[embedding]\nprecision = 'float16'\n",
     "embedding.precision"),
    ("[nosuch]\nx = 1\n", "nosuch"),
    ("search = 5\n", "search"),
])
def test_a_bad_key_or_value_is_an_error_naming_the_key(tmp_path: Path, toml: str, key: str) -> None:
    (tmp_path / "clawmem.toml").write_text(toml)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(workspace=tmp_path, environ={})


def test_bad_environment_value_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="embedding.provider"):
        load_settings(workspace=tmp_path, environ={"CLAWMEM_PROVIDER": "telepathy"})


def test_broken_toml_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "clawmem.toml").write_text("[search\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(workspace=tmp_path, environ={})


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(workspace=tmp_path, config_file=tmp_path / "nope.toml", environ={})


def test_user_config_file_is_used_when_the_workspace_has_none(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg" / "clawmem"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text("[search]\nmax_results = 11\n")
    s = load_settings(workspace=tmp_path, environ={"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert s.search.max_results == 11


def test_secrets_are_not_in_the_public_view(tmp_path: Path) -> None:
    (tmp_path / "clawmem.toml").write_text('[embedding]\napi_key = "sk-secret"\nheaders = {"X-Key" = "v"}\n')
    view = as_dict(load_settings(workspace=tmp_path, environ={}))
    assert "sk-secret" not in repr(view)


def test_the_starter_config_is_valid(template_workspace: Path) -> None:
    load_settings(workspace=template_workspace, environ={})


def _keys(cls: type, prefix: str = "") -> list[str]:
    found: list[str] = []
    for f in dataclasses.fields(cls):
        factory = f.default_factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
            found += _keys(factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
        elif f.name not in ("workspace", "config_file"):  # where the settings come from, not settings
            found.append(prefix + f.name)
    return found


@pytest.mark.parametrize("key", _keys(Settings))
def test_every_setting_is_documented_in_the_settings_page_and_the_starter_config(key: str) -> None:
    root = Path(__file__).resolve().parents[1]
    table = (root / "docs" / "settings.md").read_text(encoding="utf-8")
    starter = (root / "workspace_template" / "clawmem.toml").read_text(encoding="utf-8")
    name = key.rpartition(".")[2]
    assert f"`{name}`" in table, f"{key} is missing from docs/settings.md's table"
    assert re.search(rf"^# ?{re.escape(name)} =", starter, re.MULTILINE), f"{key} is missing from clawmem.toml"


def _starter_values() -> dict[str, object]:
    """The starter clawmem.toml's commented `# key = value` lines, by dotted key, read as TOML."""
    root = Path(__file__).resolve().parents[1]
    values: dict[str, object] = {}
    section = ""
    for line in (root / "workspace_template" / "clawmem.toml").read_text(encoding="utf-8").splitlines():
        if found := re.match(r"^\[(\w+)\]", line):
            section = found[1]
        elif found := re.match(r"^# ?(\w+) = (.+?)(?:\s{2,}#.*)?$", line):
            values[f"{section}.{found[1]}" if section else found[1]] = tomllib.loads(f"v = {found[2]}")["v"]
    return values


def _default(key: str) -> object:
    holder: object = Settings(workspace=Path("."))
    for part in key.split("."):
        holder = getattr(holder, part)
    return list(holder) if isinstance(holder, (tuple, frozenset)) else holder


@pytest.mark.parametrize("key", [k for k in _keys(Settings) if k not in ("index", "socket")])  # paths: placeholders
def test_the_starter_config_shows_each_default_the_code_has(key: str) -> None:
    """The starter file says "the values shown are the defaults": each is read from it and compared with the
    settings' own default, so a default changed in the code fails here until the file says it too."""
    shown, default = _starter_values()[key], _default(key)
    if isinstance(default, list) and isinstance(shown, list):
        shown, default = sorted(map(str, shown)), sorted(map(str, default))
    assert shown == default or (default is None and shown in ("", 0)), (key, shown, default)
