"""Settings: one frozen dataclass tree, loaded once as defaults < TOML < environment < flags.

Every key is validated at load time so a typo fails at start-up with the key's name, not later
with a confusing traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from clawmem_index.errors import ConfigError
from clawmem_index.setting_values import coerce

__all__ = [
    "BatchSettings",
    "ChunkingSettings",
    "DaemonSettings",
    "EmbeddingSettings",
    "SearchSettings",
    "Settings",
    "cache_root",
    "check_workspace",
    "load_settings",
    "workspace_id",
]

PROVIDERS = ("auto", "openai", "gemini", "voyage", "local", "none")
SEARCH_MODES = ("hybrid", "bm25", "vector")
FUSIONS = ("weighted", "rrf")
LOG_LEVELS = ("debug", "info", "warning", "error")
INDEX_BACKENDS = ("sqlite", "postgres")
PRECISIONS = ("auto", "float32", "float16")
HALF_PRECISION_ABOVE = 512  # dimensions past which `embedding.precision = "auto"` stores float16
# OpenClaw's user profiles as `exclude` globs (clawmem_index.sources.paths names them), left out by
# `user_profiles = false`.
PROFILE_GLOBS = ("USER.md", "users/*/USER.md")
MAX_CONTEXT_BUDGET = 100_000  # tokens of a `context` block: 250 chunks of 400


@dataclass(frozen=True)
class ChunkingSettings:
    """How Markdown is cut into chunks (part of the index fingerprint)."""

    tokens: int = 400
    overlap: int = 80
    tokenizer: str = "cl100k_base"

    def validate(self) -> None:
        _require(self.tokens >= 16, "chunking.tokens", "must be at least 16")
        _require(0 <= self.overlap < self.tokens, "chunking.overlap", "must be >= 0 and below chunking.tokens")
        _require(self.tokenizer in ("cl100k_base", "o200k_base"), "chunking.tokenizer",
                 "must be cl100k_base or o200k_base")


@dataclass(frozen=True)
class EmbeddingSettings:
    """Which model embeds the chunks, and how requests to it are batched, retried and bounded."""

    provider: str = "auto"
    model: str = ""
    fallback: str = ""  # unset: an explicit provider that cannot start is an error; "none": keyword-only instead
    local_model: str = ""
    local_window: int = 0  # tokens a local model embeds at once, longer texts: their windows' mean (0: auto)
    base_url: str = ""
    api_key: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    dimensions: int = 0
    batch_size: int = 64
    batch_tokens: int = 32_000  # per request: 64 chunks of 400 tokens fit, well under every provider's own limit
    max_retries: int = 5
    timeout: float = 60.0
    cache_max_entries: int = 50_000
    threads: int = 0
    # A query is a few tokens: on a busy machine all cores' threads wait on each other (2 cores, load 4 besides:
    # p95 2.1-3.9 s against 0.12 s on one thread; docs/benchmarks.md). 0: as `threads`.
    query_threads: int = 1
    isolate_local: bool = True  # the daemon runs a local model in a child process (embeddings.isolated)
    concurrency: int = 4  # remote requests in flight at once
    # How the SQLite index stores vectors: "float16" in half the bytes, "float32", or "auto": half past
    # HALF_PRECISION_ABOVE dimensions, where it costs no recall (docs/benchmarks.md) and halves the state.
    precision: str = "auto"

    def validate(self) -> None:
        _require(self.precision in PRECISIONS, "embedding.precision", f"must be one of {', '.join(PRECISIONS)}")
        _require(self.provider in PROVIDERS, "embedding.provider", f"must be one of {', '.join(PROVIDERS)}")
        _require(self.fallback in ("", *PROVIDERS), "embedding.fallback",
                 f"must be empty or one of {', '.join(PROVIDERS)}")
        _require(self.dimensions >= 0, "embedding.dimensions", "must be >= 0 (0 means the model's default)")
        _require(self.batch_size >= 1, "embedding.batch_size", "must be >= 1")
        _require(self.batch_tokens >= 64, "embedding.batch_tokens", "must be >= 64")
        _require(self.max_retries >= 0, "embedding.max_retries", "must be >= 0")
        _require(self.timeout > 0, "embedding.timeout", "must be > 0")
        _require(self.cache_max_entries >= 0, "embedding.cache_max_entries", "must be >= 0")
        _require(self.local_window == 0 or self.local_window >= 16, "embedding.local_window",
                 "must be 0 (128 for MiniLM models, else the model's context) or >= 16")
        _require(self.threads >= 0, "embedding.threads", "must be >= 0 (0 means all cores)")
        _require(self.query_threads >= 0, "embedding.query_threads", "must be >= 0 (0 means as embedding.threads)")
        _require(1 <= self.concurrency <= 32, "embedding.concurrency", "must be between 1 and 32")


@dataclass(frozen=True)
class SearchSettings:
    """How a search ranks, fuses, filters and caches its answers."""

    mode: str = "hybrid"
    max_results: int = 6
    min_score: float = 0.2
    candidate_multiplier: int = 4  # ignored: pools no longer grow with max_results (kept so old configs load)
    candidate_pool: int = 32  # each side is read this deep first, then deeper until the order is proven
    candidate_cap: int = 1024  # ... but never deeper than this
    fusion: str = "weighted"
    vector_weight: float = 0.6
    text_weight: float = 0.4
    text_exponent: float = 0.5  # hybrid: the keyword side (BM25 relative to the best, 0..1) is raised to this
    rrf_k: int = 60
    snippet_chars: int = 700
    query_timeout: float = 2.0  # seconds a search waits for its query vector before answering keyword-only
    first_query_timeout: float = 30.0  # ... and, before that, for the model to load, the first time
    decay_half_life_days: float = 0.0  # 0: off; else dated chunks lose half their score every so many days
    decay_floor: float = 0.85  # the share of its score the oldest chunk keeps
    mmr_lambda: float = 0.0  # 0: off; else relevance vs diversity (1.0: relevance only)
    mmr_pool: int = 20  # MMR re-orders this many best results (whatever max_results is)
    mmr_floor: float = 0.5  # ... of those, only ones with at least this share of the best's relevance
    early_return_ratio: float = 0.0  # 0: off; else skip the query vector when the best keyword match leads by this
    prefix_fallback: bool = True  # when nothing passes min_score, search the beginnings of the query's words
    correct_typos: bool = True  # a query word the index does not hold is also read as its words one typo away
    date_weight: float = 0.3  # the share of the score closeness to the days a query names takes (0: dates are words)
    date_half_life_days: float = 2.0  # ... closeness halves every so many days from those days
    date_window_days: int = 7  # ... and is 0 past so many days from them
    cache_entries: int = 256  # answers kept for repeated searches (0: off); any index change misses
    cache_seconds: float = 300.0  # ... and each for at most this long
    context_budget: int = 1500  # tokens of a `context` block (about 4 chunks): a prompt's share for memory

    def validate(self) -> None:
        _require(self.mode in SEARCH_MODES, "search.mode", f"must be one of {', '.join(SEARCH_MODES)}")
        _require(self.fusion in FUSIONS, "search.fusion", f"must be one of {', '.join(FUSIONS)}")
        _require(1 <= self.max_results <= 1000, "search.max_results", "must be between 1 and 1000")
        _require(0.0 <= self.min_score <= 1.0, "search.min_score", "must be between 0 and 1")
        _require(self.candidate_multiplier >= 1, "search.candidate_multiplier", "must be >= 1")
        _require(1 <= self.candidate_pool <= self.candidate_cap, "search.candidate_pool",
                 "must be >= 1 and <= search.candidate_cap")
        _require(self.candidate_cap <= 4096, "search.candidate_cap", "must be <= 4096")
        _require(0.0 <= self.decay_floor < 1.0, "search.decay_floor", "must be >= 0 and < 1")
        _require(1 <= self.mmr_pool <= 1000, "search.mmr_pool", "must be between 1 and 1000")
        _require(0.0 <= self.mmr_floor <= 1.0, "search.mmr_floor", "must be between 0 and 1")
        _require(0 <= self.cache_entries <= 100_000, "search.cache_entries", "must be between 0 (off) and 100000")
        _require(self.cache_seconds > 0, "search.cache_seconds", "must be > 0")
        _require(0.0 <= self.date_weight < 1.0, "search.date_weight", "must be >= 0 (0: off) and < 1")
        _require(self.date_half_life_days > 0, "search.date_half_life_days", "must be > 0")
        _require(0 <= self.date_window_days <= 366, "search.date_window_days", "must be between 0 and 366")
        _require(self.early_return_ratio == 0 or self.early_return_ratio >= 1, "search.early_return_ratio",
                 "must be 0 (off) or >= 1")
        _require(self.vector_weight >= 0 and self.text_weight >= 0 and self.vector_weight + self.text_weight > 0,
                 "search.vector_weight", "weights must be >= 0 and not both 0")
        _require(self.rrf_k >= 1, "search.rrf_k", "must be >= 1")
        _require(0.1 <= self.text_exponent <= 4, "search.text_exponent", "must be between 0.1 and 4")
        _require(self.snippet_chars >= 40, "search.snippet_chars", "must be >= 40")
        _require(0 < self.query_timeout <= 600, "search.query_timeout", "must be > 0 and <= 600 seconds")
        _require(0 <= self.first_query_timeout <= 600, "search.first_query_timeout", "must be >= 0 and <= 600 seconds")
        _require(self.decay_half_life_days >= 0, "search.decay_half_life_days", "must be >= 0 (0 turns decay off)")
        _require(0.0 <= self.mmr_lambda <= 1.0, "search.mmr_lambda", "must be between 0 (off) and 1")
        _require(0 <= self.context_budget <= MAX_CONTEXT_BUDGET, "search.context_budget",
                 f"must be between 0 and {MAX_CONTEXT_BUDGET} tokens")


@dataclass(frozen=True)
class BatchSettings:
    """Large backfills as provider batch jobs (OpenAI, Gemini): cheaper, asynchronous, minutes to hours."""

    enabled: str = "auto"  # auto: with the vendor's own endpoint (OpenAI, Gemini); on; off
    threshold: int = 5000  # chunks waiting for a vector, not in the cache, before a job is worth it
    wait: bool = True  # `clawmem index` waits for its jobs (the daemon never waits: it polls)
    poll_interval: float = 30.0
    timeout_minutes: float = 60.0  # a job still running after this is cancelled; its chunks go synchronous
    concurrency: int = 2  # jobs running at once

    def validate(self) -> None:
        _require(self.enabled in ("auto", "on", "off"), "batch.enabled", "must be auto, on or off")
        _require(self.threshold >= 1, "batch.threshold", "must be >= 1")
        _require(self.poll_interval > 0, "batch.poll_interval", "must be > 0")
        _require(self.timeout_minutes > 0, "batch.timeout_minutes", "must be > 0")
        _require(1 <= self.concurrency <= 16, "batch.concurrency", "must be between 1 and 16")


@dataclass(frozen=True)
class DaemonSettings:
    """The long-lived service: how it debounces edits, rescans and idles."""

    debounce: float = 1.5
    max_delay: float = 10.0
    rescan_interval: float = 300.0
    idle_timeout: float = 300.0
    first_build_wait: float = 30.0  # seconds a query waits for a new index's first keyword pass
    # Seconds without a request, a connection or work in progress after which the daemon exits (0: never). For
    # daemons started on demand (the OpenClaw plugin's), as socket activation would: the next request starts one.
    exit_when_idle: float = 0.0

    def validate(self) -> None:
        _require(self.debounce >= 0, "daemon.debounce", "must be >= 0")
        _require(self.max_delay >= self.debounce, "daemon.max_delay", "must be >= daemon.debounce")
        _require(self.rescan_interval >= 0, "daemon.rescan_interval", "must be >= 0 (0 disables)")
        _require(self.idle_timeout > 0, "daemon.idle_timeout", "must be > 0")
        _require(self.first_build_wait >= 0, "daemon.first_build_wait", "must be >= 0")
        _require(self.exit_when_idle == 0 or self.exit_when_idle >= 1, "daemon.exit_when_idle",
                 "must be 0 (never) or at least 1 second")


@dataclass(frozen=True)
class Settings:
    """Every setting of one workspace, validated: the one configuration object a process loads."""

    workspace: Path = Path(".")
    index: Path | None = None
    socket: Path | None = None
    index_backend: str = "sqlite"  # or "postgres": the index in a shared PostgreSQL (pgvector) at index_url
    index_url: str = ""  # postgresql://user@host/db; the password from PGPASSWORD or ~/.pgpass, not the TOML
    workspace_name: str = ""  # this workspace's name in a shared index (default: the folder's name)
    extra_paths: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ("memory/templates/**",)  # globs over index keys: never indexed, never read
    user_profiles: bool = True  # USER.md and users/<id>/USER.md are memory (OpenClaw's user profile)
    sources: tuple[str, ...] = ("memory",)  # add "sessions" to index agent transcripts too
    sessions_dir: str = "sessions"  # *.jsonl transcripts, relative to the workspace (or absolute)
    refuse_hardlinks: bool = False  # skip (sync) and refuse (get) memory files with more than one hard link
    max_file_bytes: int = 16 << 20  # a larger memory file is not read (it is reported as skipped); 0: no limit
    log_level: str = "info"
    chunking: ChunkingSettings = field(default_factory=ChunkingSettings)
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    batch: BatchSettings = field(default_factory=BatchSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    config_file: Path | None = None

    @property
    def cache_dir(self) -> Path:
        """clawmem's per-user cache: models and, by default, the indexes (never inside a workspace)."""
        return cache_root()

    @property
    def excluded(self) -> tuple[str, ...]:
        """The globs no file is indexed or read under: `exclude`, and the user profiles when they are off."""
        return self.exclude if self.user_profiles else (*self.exclude, *PROFILE_GLOBS)

    @property
    def index_path(self) -> Path:
        return self.index if self.index is not None else cache_root() / _workspace_key(self.workspace) / "index.sqlite"

    @property
    def workspace_id(self) -> str:
        """The workspace's key in a shared index: from its configured name, never from a host path."""
        return workspace_id(self.workspace_name or self.workspace.name)

    def vector_precision(self, dims: int) -> str:
        """How this index stores vectors of `dims` dimensions: float16 or float32 ("auto" picks; the shared
        PostgreSQL index stores float32)."""
        if self.embedding.precision != "auto":
            return self.embedding.precision
        return "float16" if self.index_backend == "sqlite" and dims > HALF_PRECISION_ABOVE else "float32"

    @property
    def socket_path(self) -> Path:
        if self.socket is not None:
            return self.socket
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = Path(runtime) / "clawmem" if runtime else cache_root() / "run"
        return base / f"{_workspace_key(self.workspace)}.sock"

    @property
    def daemon_lock_path(self) -> Path:
        """The lock that admits one daemon per workspace, whatever socket or index each is given."""
        return cache_root() / "daemons" / f"{_workspace_key(self.workspace)}.lock"

    def validate(self) -> None:
        _require(self.log_level in LOG_LEVELS, "log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        _require(bool(self.sources) and set(self.sources) <= {"memory", "sessions"}, "sources",
                 "must list memory and/or sessions")
        _require(bool(self.sessions_dir.strip()), "sessions_dir", "must not be empty")
        _require(self.max_file_bytes >= 0, "max_file_bytes", "must be 0 (no limit) or a number of bytes")
        _require(self.index_backend in INDEX_BACKENDS, "index_backend", f"must be one of {', '.join(INDEX_BACKENDS)}")
        _require(self.index_backend != "postgres" or self.index_url.startswith(("postgresql://", "postgres://")),
                 "index_url", "must be a postgresql:// URL when index_backend is postgres")
        _require(self.index_backend != "postgres" or self.embedding.precision != "float16", "embedding.precision",
                 "float16 is for the SQLite index; the shared PostgreSQL index stores float32 vectors")
        _require(bool(workspace_id(self.workspace_name or self.workspace.name)), "workspace_name",
                 "must hold a letter or digit")
        for section in (self.chunking, self.embedding, self.search, self.batch, self.daemon):
            section.validate()


SECTIONS: dict[str, type] = {
    "chunking": ChunkingSettings,
    "embedding": EmbeddingSettings,
    "search": SearchSettings,
    "batch": BatchSettings,
    "daemon": DaemonSettings,
}

ENV_KEYS: dict[str, str] = {
    "CLAWMEM_WORKSPACE": "workspace",
    "CLAWMEM_INDEX": "index",
    "CLAWMEM_SOCKET": "socket",
    "CLAWMEM_PROVIDER": "embedding.provider",
    "CLAWMEM_MODEL": "embedding.model",
    "CLAWMEM_LOCAL_MODEL": "embedding.local_model",
    "CLAWMEM_FALLBACK": "embedding.fallback",
    "CLAWMEM_LOG_LEVEL": "log_level",
    "CLAWMEM_SOURCES": "sources",  # "memory,sessions"
    "CLAWMEM_INDEX_BACKEND": "index_backend",
    "CLAWMEM_INDEX_URL": "index_url",
    "CLAWMEM_WORKSPACE_NAME": "workspace_name",
    "CLAWMEM_EXIT_WHEN_IDLE": "daemon.exit_when_idle",  # what the OpenClaw plugin gives the daemons it starts
}


def load_settings(
    *,
    workspace: str | os.PathLike[str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings for one workspace.

    `overrides` maps dotted keys (``"search.max_results"``) to values from command-line flags.
    """
    env = os.environ if environ is None else environ
    ws = Path(workspace or env.get("CLAWMEM_WORKSPACE") or ".").expanduser().resolve()

    layers: list[tuple[str, dict[str, Any]]] = []
    toml_path = _find_config(ws, config_file, env)
    if toml_path is not None:
        layers.append((str(toml_path), _flatten(_read_toml(toml_path))))
    layers.append(("environment", {ENV_KEYS[k]: v for k, v in env.items() if k in ENV_KEYS and v != ""}))
    layers.append(("command line", {k: v for k, v in (overrides or {}).items() if v is not None}))

    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for origin, values in layers:
        for key, raw in values.items():
            if key == "workspace" and origin != str(toml_path):
                continue
            target, name, ftype = _lookup(key, origin)
            value = coerce(key, raw, ftype)
            if name in ("index", "socket"):
                from_file = toml_path is not None and origin == str(toml_path)
                value = _resolve_path(value, toml_path.parent if from_file and toml_path else Path.cwd())
            (sections[target] if target else top)[name] = value

    top.pop("workspace", None)
    if toml_path is not None and _has_password(_flatten(_read_toml(toml_path)).get("index_url")):
        raise ConfigError(f"{toml_path}: index_url holds a password; give it in PGPASSWORD (or ~/.pgpass), or the"
                          " whole URL in CLAWMEM_INDEX_URL (a systemd EnvironmentFile), not in the settings file")
    try:
        settings = Settings(
            workspace=ws,
            config_file=toml_path,
            **top,
            **{name: cls(**sections[name]) for name, cls in SECTIONS.items()},
        )
    except TypeError as exc:  # pragma: no cover - _lookup rejects unknown keys first
        raise ConfigError(str(exc)) from exc
    settings.validate()
    return settings


def check_workspace(workspace: Path) -> None:
    """A workspace must be an existing folder: syncing a typo (or an unmounted disk) would empty the index."""
    if not workspace.exists():
        raise ConfigError(f"workspace {workspace} does not exist (create one with `clawmem init {workspace}`)")
    if not workspace.is_dir():
        raise ConfigError(f"workspace {workspace} is not a directory")


def workspace_id(name: str) -> str:
    """A name as a shared index keys it: lower case letters, digits, `-`, `_` and `.`, at most 63."""
    cleaned = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.") else "-" for ch in name.strip().lower())
    return cleaned.strip("-.")[:63]


def _has_password(url: object) -> bool:
    if not isinstance(url, str):
        return False
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    return bool(parts.password) or "password" in parse_qs(parts.query)


def with_overrides(settings: Settings, **section_values: Mapping[str, Any]) -> Settings:
    """A copy of `settings` with some section fields replaced, validated (used by tests and reloads)."""
    changes = {name: replace(getattr(settings, name), **values) for name, values in section_values.items()}
    new = replace(settings, **changes)
    new.validate()
    return new


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"invalid setting {key!r}: {message}")


def cache_root() -> Path:
    """clawmem's per-user cache folder: $XDG_CACHE_HOME/clawmem, else ~/.cache/clawmem."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clawmem"


def _workspace_key(workspace: Path) -> str:
    resolved = str(Path(workspace).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(resolved).name)[:40] or "root"
    return f"{name}-{digest}"


def _find_config(ws: Path, explicit: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path | None:
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        return path
    candidate = ws / "clawmem.toml"
    if candidate.is_file():
        return candidate
    home = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "clawmem" / "config.toml"
    return home if home.is_file() else None


def _read_toml(path: Path) -> dict[str, Any]:
    import tomllib  # here: a workspace without a settings file never needs the parser

    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc


def _flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(f"invalid setting {key!r}: must be a table")
            for sub, subvalue in value.items():
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    return flat


def _lookup(key: str, origin: str) -> tuple[str | None, str, Any]:
    section, _, name = key.rpartition(".")
    owner = SECTIONS.get(section) if section else Settings
    known = {f.name: f.type for f in fields(owner)} if owner else {}
    if owner is None or name not in known or (not section and (name in SECTIONS or name == "config_file")):
        raise ConfigError(f"unknown setting {key!r} (from {origin})")
    return (section or None), name, known[name]


def _resolve_path(value: Path, base: Path) -> Path:
    """`~` expanded; relative to the settings file's folder (from the file) or the current one (env, flags)."""
    value = value.expanduser()
    return value if value.is_absolute() else (base / value).resolve()


def as_dict(settings: Settings) -> dict[str, Any]:
    """A JSON-friendly view of the settings with secrets removed (for `status`)."""
    data = dataclasses.asdict(settings)
    data["embedding"].pop("api_key", None)
    data["embedding"]["headers"] = sorted(data["embedding"]["headers"])
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}
