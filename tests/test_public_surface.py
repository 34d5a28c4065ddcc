"""What users and other programs build on, pinned: moving modules between folders (the package's layers) must
not rename or drop any of it. Additions are free; a removal or a rename fails here first.
"""

from __future__ import annotations

import importlib

from clawmem_index import cli, config
from clawmem_index.mcp import server as mcp_server
from clawmem_index.service import protocol

# Names the README and the docs tell people to import.
DOCUMENTED_IMPORTS = {
    "clawmem_index": ["Client", "__version__", "DISTRIBUTION"],
    "clawmem_index.api": ["Client"],
    "clawmem_index.errors": ["ClawmemError", "ConfigError", "PathError", "QueryError", "IndexUnavailable",
                             "ProviderError", "ProtocolError", "ServerBusy", "DaemonUnreachable"],
    "clawmem_index.pg.schema": ["grant_workspace", "migrate"],
    "clawmem_index.index.pg.schema": ["grant_workspace", "migrate"],
    "clawmem_index.embeddings.fake": ["FakeProvider"],
}

CLI_COMMANDS = {"context", "get", "grant", "import-openclaw", "index", "init", "install-service", "mcp", "reindex",
                "search", "serve", "services", "status", "take-over", "uninstall-service"}

SOCKET_METHODS = {
    "search": {"query", "max_results", "min_score", "mode", "path_prefix", "source", "since", "before", "explain",
               "workspaces"},
    "get": {"path", "from", "lines", "max_bytes"},
    "status": set(),
    "context": {"query", "budget", "max_results", "min_score", "mode", "path_prefix", "source", "since", "before",
                "workspaces"},
    "sync": {"wait"},
    "reindex": {"wait"},
}

MCP_TOOLS = {"memory_search", "memory_get", "memory_status", "memory_context"}

SETTINGS = {
    "workspace", "index", "socket", "index_backend", "index_url", "workspace_name", "extra_paths", "exclude",
    "sources", "sessions_dir", "refuse_hardlinks", "max_file_bytes", "log_level",
    "chunking.tokens", "chunking.overlap", "chunking.tokenizer",
    "embedding.provider", "embedding.model", "embedding.fallback", "embedding.local_model", "embedding.local_window",
    "embedding.base_url", "embedding.headers", "embedding.dimensions", "embedding.batch_size",
    "embedding.batch_tokens", "embedding.max_retries", "embedding.timeout", "embedding.cache_max_entries",
    "embedding.threads", "embedding.query_threads", "embedding.isolate_local", "embedding.concurrency",
    "embedding.precision",
    "search.mode", "search.max_results", "search.min_score", "search.candidate_pool", "search.candidate_cap",
    "search.fusion", "search.vector_weight", "search.text_weight", "search.text_exponent", "search.rrf_k",
    "search.snippet_chars", "search.query_timeout", "search.first_query_timeout", "search.decay_half_life_days",
    "search.decay_floor", "search.mmr_lambda", "search.mmr_pool", "search.mmr_floor", "search.early_return_ratio",
    "search.prefix_fallback", "search.cache_entries", "search.cache_seconds", "search.context_budget",
    "batch.enabled", "batch.threshold", "batch.wait", "batch.poll_interval", "batch.timeout_minutes",
    "batch.concurrency",
    "daemon.debounce", "daemon.max_delay", "daemon.rescan_interval", "daemon.idle_timeout", "daemon.first_build_wait",
}


def test_the_documented_imports_stay() -> None:
    for module, names in DOCUMENTED_IMPORTS.items():
        loaded = importlib.import_module(module)
        missing = [name for name in names if getattr(loaded, name, None) is None]
        assert not missing, f"{module} lost {missing}"


def test_the_cli_keeps_its_commands() -> None:
    assert CLI_COMMANDS <= set(cli.cli.commands)


def test_the_socket_protocol_keeps_its_methods_and_parameters() -> None:
    for method, params in SOCKET_METHODS.items():
        assert method in protocol.PARAMS, method
        assert params <= set(protocol.PARAMS[method]), method


def test_the_mcp_tools_stay() -> None:
    assert MCP_TOOLS <= {tool.name for tool in mcp_server.TOOLS}


def test_every_setting_keeps_its_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = config.as_dict(config.load_settings(workspace=tmp_path, environ={}))
    names = {f"{section}.{key}" for section, values in settings.items() if section in config.SECTIONS
             for key in values} | {key for key in settings if key not in config.SECTIONS}
    assert SETTINGS <= names, sorted(SETTINGS - names)
