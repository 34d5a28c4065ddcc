"""An OpenClaw agent's memory-search settings as clawmem settings (for `clawmem import-openclaw`).

OpenClaw keeps them in its JSON5 config (`memory.search`, per agent `agents.entries.<id>.memory.search`, and the
legacy `memorySearch` keys). What maps one to one is carried (provider, model, base URL, headers, dimensions,
result count, sources); what clawmem does differently or cannot do is named, never dropped silently. Keys are
never copied into a file: clawmem reads them from the provider's environment variable.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawmem_index.errors import ConfigError

# OpenClaw provider -> (clawmem provider, the key variable clawmem reads). OpenAI-compatible servers go through
# clawmem's openai provider with their base URL.
PROVIDERS: dict[str, tuple[str, str]] = {
    "openai": ("openai", "OPENAI_API_KEY"),
    "gemini": ("gemini", "GEMINI_API_KEY"),
    "voyage": ("voyage", "VOYAGE_API_KEY"),
    "local": ("local", ""),
    "none": ("none", ""),
    "openai-compatible": ("openai", "OPENAI_API_KEY"),
    "ollama": ("openai", "OPENAI_API_KEY"),
    "lmstudio": ("openai", "OPENAI_API_KEY"),
    "mistral": ("openai", "OPENAI_API_KEY"),
    "deepinfra": ("openai", "OPENAI_API_KEY"),
}
NEEDS_BASE_URL = {"openai-compatible", "ollama", "lmstudio", "mistral", "deepinfra"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class Imported:
    """The clawmem settings found (section -> key -> value) and one line per thing not carried."""

    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    workspace: Path | None = None

    def put(self, section: str, key: str, value: Any) -> None:
        self.settings.setdefault(section, {})[key] = value

    def toml(self) -> str:
        blocks = []
        for section, values in self.settings.items():
            body = [f"{key} = {_toml_value(value)}" for key, value in values.items()]
            blocks.append("\n".join(([f"[{section}]"] if section else []) + body))
        return "\n\n".join(blocks) + "\n" if blocks else ""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a TOML basic string


MAX_CONFIG_BYTES = 256 * 1024  # an OpenClaw config is a few KB; JSON5 parses ~13 us a byte, so this is ~3 s at most


def read_openclaw_config(path: Path) -> dict[str, Any]:
    """OpenClaw's JSON5 config as a dict; any file that is not one (a FIFO, a device, a huge or deeply nested file,
    text that is not Unicode) is a ConfigError saying so, never a hang or a traceback."""
    import json5

    where = repr(str(path))
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; what is opened is checked before it is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read OpenClaw's config {where}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ConfigError(f"OpenClaw's config {where} is not a regular file: give its openclaw.json")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"OpenClaw's config {where} is {info.st_size:,} bytes: more than an OpenClaw config "
                              f"holds ({MAX_CONFIG_BYTES:,} at most); give its openclaw.json")
        try:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read OpenClaw's config {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"OpenClaw's config {where} grew past {MAX_CONFIG_BYTES:,} bytes while it was read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"OpenClaw's config {where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        try:
            data = json.loads(text)  # most configs are plain JSON: C-fast, and the same value JSON5 would give
        except ValueError:
            data = json5.loads(text)
    except RecursionError:
        raise ConfigError(f"OpenClaw's config {where} is nested too deeply to be a config") from None
    except ValueError as exc:
        raise ConfigError(f"OpenClaw's config {where} is not valid JSON5: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"OpenClaw's config {where} is not an object")
    bad = _not_text(data)
    if bad is not None:
        raise ConfigError(f"OpenClaw's config {where} has a string that is not text at {bad} (an unpaired "
                          "surrogate escape): fix it there")
    return data


def _not_text(data: Any) -> str | None:
    """The path of the first key or string holding a lone surrogate (text no file or terminal can hold), or None.
    Iterative: a config's depth is the parser's limit, not this walk's."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return where or "the top"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return f"{where}.{key!a}".lstrip(".")
                stack.append((f"{where}.{key}".lstrip("."), item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


def includes(config: Mapping[str, Any]) -> list[str]:
    """Where the config uses OpenClaw's `$include` (not followed by clawmem: those files' settings are not read)."""
    found = []
    stack: list[tuple[str, Any]] = [("", config)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            if "$include" in value:
                found.append(where or "the top level")
            stack.extend((f"{where}.{key}".lstrip("."), item) for key, item in value.items() if key != "$include")
    return sorted(found)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def memory_search_settings(config: Mapping[str, Any], agent: str | None) -> dict[str, Any]:
    """The agent's effective memory-search settings: the legacy keys, then `memory.search`, then the agent's own
    (later wins; extraPaths add up, as in OpenClaw)."""
    agents = _dict(config.get("agents"))
    layers = [_dict(config.get("memorySearch")), _dict(_dict(agents.get("defaults")).get("memorySearch")),
              _dict(_dict(config.get("memory")).get("search"))]
    if agent is not None:
        entry = _dict(_dict(agents.get("entries")).get(agent))
        layers += [_dict(entry.get("memorySearch")), _dict(_dict(entry.get("memory")).get("search"))]
    merged: dict[str, Any] = {}
    extra: list[Any] = []
    for layer in layers:
        for key, value in layer.items():
            if key == "extraPaths":
                extra += value if isinstance(value, list) else [value]
            elif isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    if extra:
        merged["extraPaths"] = extra
    return merged


def agent_workspace(config: Mapping[str, Any], agent: str | None, env: Mapping[str, str]) -> Path:
    agents = _dict(config.get("agents"))
    own = _dict(_dict(agents.get("entries")).get(agent)).get("workspace") if agent else None
    folder = own or _dict(agents.get("defaults")).get("workspace")
    if isinstance(folder, str) and folder:
        return Path(_expand(folder, env)).expanduser()
    state = env.get("OPENCLAW_STATE_DIR") or str(Path.home() / ".openclaw")
    return Path(state) / "workspace"


def _expand(text: str, env: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _key_variable(api_key: Any) -> str | None:
    """The environment variable an OpenClaw apiKey names (`${VAR}` or an env SecretRef), None for a literal."""
    if isinstance(api_key, dict) and api_key.get("source") == "env" and isinstance(api_key.get("id"), str):
        return str(api_key["id"])
    if isinstance(api_key, str) and (m := _VAR.fullmatch(api_key.strip())):
        return m.group(1)
    return None


def import_settings(search: Mapping[str, Any], env: Mapping[str, str]) -> Imported:  # noqa: C901
    """OpenClaw's memory-search settings as clawmem settings, with a note for everything not carried."""
    out = Imported()
    if search.get("enabled") is False:
        out.notes.append("memory search is disabled for this agent in OpenClaw; clawmem indexes anyway")
    name = str(search.get("provider") or "openai")
    provider, key_var = PROVIDERS.get(name, ("", ""))
    remote = _dict(search.get("remote"))
    if not provider:
        out.notes.append(f"provider {name!r} has no clawmem counterpart: clawmem keeps its default (auto: the "
                         "local model when installed, else keyword search); choose one of openai, gemini, voyage, "
                         "local or none in [embedding]")
    else:
        out.put("embedding", "provider", provider)
        if name in NEEDS_BASE_URL and not remote.get("baseUrl"):
            out.notes.append(f"provider {name!r} is OpenAI-compatible, but its base URL is not in OpenClaw's "
                             "settings: set embedding.base_url to the server's /v1 address")
    if isinstance(search.get("model"), str) and search["model"]:
        out.put("embedding", "model", _expand(search["model"], env))
    if isinstance(search.get("fallback"), str) and search["fallback"]:
        fallback = PROVIDERS.get(search["fallback"], ("", ""))[0]
        if fallback in ("none", "local"):
            out.put("embedding", "fallback", fallback)
        else:
            out.notes.append(f"fallback {search['fallback']!r} is not carried: clawmem falls back to local or none")
    if isinstance(remote.get("baseUrl"), str) and remote["baseUrl"]:
        out.put("embedding", "base_url", _expand(remote["baseUrl"], env))
    headers = _dict(remote.get("headers"))
    if headers:
        literal = {k: v for k, v in headers.items() if isinstance(v, str) and not _VAR.search(v)}
        if literal:
            out.put("embedding", "headers", literal)
        if len(literal) < len(headers):
            out.notes.append("headers that name environment variables are not carried: add them to "
                             "embedding.headers by hand")
    if isinstance(search.get("outputDimensionality"), int):
        out.put("embedding", "dimensions", search["outputDimensionality"])
    local_model = _dict(search.get("local")).get("modelPath")
    if isinstance(local_model, str) and local_model:
        out.put("embedding", "local_model", _expand(local_model, env))
    if "apiKey" in remote and key_var:
        named = _key_variable(remote["apiKey"])
        if named == key_var:
            out.notes.append(f"the key stays in {key_var}: clawmem's daemon must see it in its environment")
        elif named:
            out.notes.append(f"the key is in {named}: give it to clawmem's daemon as {key_var} (keys never go "
                             "into clawmem.toml)")
        else:
            out.notes.append(f"the key is written in OpenClaw's config: give it to clawmem's daemon as {key_var} "
                             "(keys never go into clawmem.toml)")
    elif key_var and provider != "none":
        out.notes.append(f"clawmem reads the key from {key_var} (OpenClaw's auth profiles are not read)")
    if isinstance(remote.get("batch"), dict) and "enabled" in remote["batch"]:
        out.put("batch", "enabled", bool(remote["batch"]["enabled"]))
    query = _dict(search.get("query"))
    if isinstance(query.get("maxResults"), int) and query["maxResults"] > 0:
        out.put("search", "max_results", query["maxResults"])
    if "minScore" in query:
        out.notes.append("query.minScore is not carried: clawmem's scores are on another scale (see "
                         "search.min_score in docs/settings.md)")
    sources = search.get("sources")
    if isinstance(sources, list) and set(sources) <= {"memory", "sessions"} and sources:
        out.put("", "sources", list(dict.fromkeys(sources)))
        if "sessions" in sources:
            out.notes.append("sessions: clawmem indexes *.jsonl transcripts under the workspace's sessions_dir; "
                             "point it at the agent's OpenClaw session folder")
    if search.get("extraPaths"):
        out.notes.append("extraPaths are not carried: clawmem indexes MEMORY.md and memory/**/*.md of the workspace")
    for key in ("cache", "store", "chunking", "sync", "experimental"):
        if key in search:
            out.notes.append(f"{key} is not carried: clawmem keeps its own (see docs/settings.md)")
    if "" in out.settings:  # top-level keys come before any [section] in TOML
        out.settings = {"": out.settings.pop(""), **out.settings}
    return out
