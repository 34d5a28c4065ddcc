"""`clawmem mcp`: the memory tools for agent hosts, over the Model Context Protocol.

The tools are OpenClaw's, with its names, parameters and result fields, so prompts written for
OpenClaw's memory work unchanged: `memory_search {query, maxResults, minScore}` and `memory_get
{path, from, lines}`; clawmem adds `memory_status` and `memory_context {query, budget}` (the
passive-injection block of clawmem_index.search.context). On a shared index, memory_search and memory_context
also take `workspaces`, the names of the workspaces to gather from. Each answers through a
clawmem_index.api.Client: the workspace's daemon when one answers, else the index file read-only.

Two parts: the tools as plain data and functions (`TOOLS`, `call_tool`), which need no SDK, and
the glue to the official `mcp` SDK (`build_server`, `serve`), imported only when a server runs. A
tool that fails (a refused path, an empty query, no index yet) answers an MCP tool error
(`isError`) carrying clawmem's message; it never ends the server.

Start-up cost is the SDK's import (about a second on a small machine); clawmem's own modules
(the engine, SQLite, tiktoken, providers) load at the first tool call, not before `initialize`.
stdio is what agent hosts launch; `--http` serves Streamable HTTP on 127.0.0.1 only, to holders
of its bearer token, with bounded sessions and the SDK's DNS-rebinding protection (clawmem_index.mcp.http).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import math
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawmem_index import DISTRIBUTION, __version__
from clawmem_index.api import coverage_notes
from clawmem_index.config import MAX_CONTEXT_BUDGET
from clawmem_index.errors import ClawmemError, ConfigError, ExtraNotInstalled, QueryError
from clawmem_index.search.context import citation
from clawmem_index.service.params import MAX_WORKSPACES
from clawmem_index.text.storable import storable

if TYPE_CHECKING:
    from clawmem_index.api import Client

__all__ = ["TOOLS", "ToolAnswer", "ToolSpec", "build_server", "call_tool", "require_sdk", "serve"]

HOST = "127.0.0.1"
PATH = "/mcp"
INSTALL = f"pip install '{DISTRIBUTION}[mcp]'"
MAX_RESULTS = 1000
TOOL_THREADS = 4  # tool calls run on worker threads (the client blocks), this many at once

INSTRUCTIONS = (
    "clawmem serves this agent's long-term memory: MEMORY.md and the notes under memory/. Call memory_search"
    " before answering anything about prior work, decisions, dates, people, preferences or todos, then"
    " memory_get to read only the lines you need. Cite what you use as path#Lstart-Lend."
)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class ToolAnswer:
    """What a tool returns: the text the model reads, the same data as JSON, and whether it failed."""

    text: str
    data: dict[str, Any] | None = None
    error: bool = False


NOW = {"type": "string", "maxLength": 40,
       "description": "Today's date (YYYY-MM-DD) for relative dates in the query such as 'yesterday'"
                      " (default: the server's today)."}
WORKSPACES = {"type": "array", "items": {"type": "string"}, "maxItems": MAX_WORKSPACES,
              "description": "Shared index only: the workspaces to search (names); each result then names its"
                             " workspace."}


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "memory_search",
        "Mandatory recall step: search the memory (MEMORY.md + memory/**/*.md) by meaning and keywords before"
        " answering questions about prior work, decisions, dates, people, preferences, or todos. Returns the top"
        " snippets with path, line range, score, source and a citation (path#Lstart-Lend); then use memory_get"
        " to pull only the lines you need from a memory file. A result whose source is \"sessions\" (a past"
        " conversation's transcript) cannot be read with memory_get: its snippet is the text.",
        _schema({
            "query": {"type": "string", "description": "What to recall: keywords or a question in plain words."},
            "maxResults": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS,
                           "description": "How many snippets at most (default 6)."},
            "minScore": {"type": "number", "minimum": 0, "maximum": 1,
                         "description": "Leave out snippets scoring below this, 0..1 (default 0.2)."},
            "explain": {"type": "boolean",
                        "description": "Also say how each snippet got its place (keyword/vector rank and score)."},
            "workspaces": WORKSPACES,
            "now": NOW,
        }, ("query",)),
    ),
    ToolSpec(
        "memory_get",
        "Safe read of a memory file (MEMORY.md or memory/**/*.md) with optional from/lines; use after"
        " memory_search to pull only the needed lines and keep context small. Other paths are refused,"
        " transcripts (sessions/*.jsonl) too: use their memory_search snippet.",
        _schema({
            "path": {"type": "string", "description": "Workspace-relative path, e.g. memory/2026-11-22.md."},
            "from": {"type": "integer", "minimum": 1, "description": "First line to read (1-based; default 1)."},
            "lines": {"type": "integer", "minimum": 1, "description": "How many lines (default: to the end)."},
        }, ("path",)),
    ),
    ToolSpec(
        "memory_status",
        "How fresh the memory index is: files and chunks indexed, embedding provider and model, files and"
        " embeddings still pending, the last sync, and whether the clawmem daemon serves it.",
        _schema({}),
    ),
    ToolSpec(
        "memory_context",
        "A ready-made memory block for a topic: the best matching lines from memory, grouped by file and"
        " labelled path#Lstart-Lend, cut to a token budget (whole lines only). Use it to load background"
        " memory at the start of a task; use memory_search for specific questions.",
        _schema({
            "query": {"type": "string", "description": "The topic or task to gather memory for."},
            "budget": {"type": "integer", "minimum": 0, "maximum": MAX_CONTEXT_BUDGET,
                       "description": "Most tokens the block may take (default 1500)."},
            "workspaces": WORKSPACES,
            "now": NOW,
        }, ("query",)),
    ),
)
_BY_NAME = {tool.name: tool for tool in TOOLS}


# -- the tools ---------------------------------------------------------------------------------


def call_tool(client: Client, name: str, arguments: Mapping[str, Any] | None) -> ToolAnswer:
    """Run one tool; every clawmem failure (and a bad argument) is a tool error with its message.

    Text in the arguments is made storable first (a lone surrogate, which JSON can escape but
    UTF-8 cannot encode, becomes U+FFFD), and so is the answer: an answer the SDK cannot encode
    would never be sent, and the host would wait for it forever.
    """
    spec = _BY_NAME.get(name)
    if spec is None:
        return ToolAnswer(storable(f"unknown tool {name!r} (tools: {', '.join(_BY_NAME)})"), error=True)
    try:
        args = _arguments(spec, _repaired(arguments or {}))
        data, text = _TOOL_CALLS[name](client, args)
    except ClawmemError as exc:
        return ToolAnswer(storable(str(exc)), error=True)
    except Exception as exc:  # a bug: the host gets a tool error, stderr the traceback, the server lives on
        logging.getLogger("clawmem.mcp").exception("tool %s failed", name)
        return ToolAnswer(storable(f"internal error in {name}: {type(exc).__name__}: {exc}"), error=True)
    return ToolAnswer(storable(text), _repaired(data))


def _repaired(value: Any) -> Any:
    """`value` with every string in it made storable (keys included), however deeply nested."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, Mapping):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_repaired(v) for v in value]
    return value


def _search(client: Client, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    answer = client.search(args["query"], max_results=args.get("maxResults"), min_score=args.get("minScore"),
                           explain=bool(args.get("explain")), workspaces=args.get("workspaces"), now=args.get("now"))
    results = [{"path": r["path"], "startLine": r["start_line"], "endLine": r["end_line"], "score": r["score"],
                "snippet": r["snippet"], "source": r["source"],
                "citation": citation(r["path"], r["start_line"], r["end_line"]),
                **{key: r[key] for key in ("workspace", "explain") if key in r}} for r in answer["results"]]
    data: dict[str, Any] = {"results": results, "provider": answer["provider"], "model": answer["model"],
                            "mode": answer["mode"]}
    if answer.get("fallback"):
        data["fallback"] = True
    data["index"] = answer["index"]
    for key in ("warning", "unreadable_workspaces", "query"):
        if answer.get(key):
            data[key] = answer[key]
    return data, _json(data)


def _get(client: Client, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    answer = client.get(args["path"], start=args.get("from"), lines=args.get("lines"))
    data: dict[str, Any] = {key: answer[key] for key in ("path", "text", "from", "lines", "truncated", "next_from")
                            if key in answer}
    return data, _json(data)


def _status(client: Client, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    data = client.status()
    data["served_by"] = client.served_by
    return data, _json(data)


def _context(client: Client, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    answer = client.context(args["query"], budget=args.get("budget"), workspaces=args.get("workspaces"),
                            now=args.get("now"))
    sections = [{"path": s["path"], "startLine": s["start_line"], "endLine": s["end_line"], "score": s["score"],
                 "citation": s["citation"], **({"workspace": s["workspace"]} if "workspace" in s else {})}
                for s in answer["sections"]]
    data = {**answer, "sections": sections}
    if answer["text"]:
        text = str(answer["text"])
    elif answer["hits"]:
        text = f"(no memory lines fit in {answer['budget']} tokens)"
    else:
        text = "(no memory matched this query)"
    return data, text + "".join(f"\n(note: {note})" for note in coverage_notes(answer))


_TOOL_CALLS: dict[str, Callable[[Client, dict[str, Any]], tuple[dict[str, Any], str]]] = {
    "memory_search": _search, "memory_get": _get, "memory_status": _status, "memory_context": _context,
}


def _arguments(spec: ToolSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments checked against the tool's schema: types, bounds, required and unknown names.

    Lenient where models are sloppy: a whole number sent as 6.0 or "6" is taken as 6.
    """
    properties: dict[str, Any] = spec.input_schema["properties"]
    unknown = sorted(set(given) - set(properties))
    if unknown:
        expected = ", ".join(properties) or "none"
        raise QueryError(f"unknown argument {unknown[0]!r} for {spec.name} (arguments: {expected})")
    checked: dict[str, Any] = {}
    for name, schema in properties.items():
        value = given.get(name)
        if value is None:
            if name in spec.input_schema["required"]:
                raise QueryError(f"{spec.name} needs {name!r}")
            continue
        checked[name] = _value(name, value, schema)
    return checked


def _value(name: str, value: Any, schema: Mapping[str, Any]) -> Any:
    kind = schema["type"]
    if kind == "array":
        return _array(name, value, schema)
    if kind == "boolean":
        if not isinstance(value, bool):
            raise QueryError(f"{name!r} must be true or false")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise QueryError(f"{name!r} must be a string")
        return value
    number = _number(value)
    if number is None or (kind == "integer" and not float(number).is_integer()):
        raise QueryError(f"{name!r} must be {'an integer' if kind == 'integer' else 'a number'}")
    number = int(number) if kind == "integer" else number
    low, high = schema.get("minimum"), schema.get("maximum")
    if (low is not None and number < low) or (high is not None and number > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise QueryError(f"{name!r} must be {bounds}")
    return number


def _array(name: str, value: Any, schema: Mapping[str, Any]) -> list[Any]:
    """A list whose items each pass their own schema; strict (a lone string is not taken as one item)."""
    what = f"an array of {schema['items']['type']}s"
    if not isinstance(value, list):
        raise QueryError(f"{name!r} must be {what}")
    most = schema.get("maxItems")
    if most is not None and len(value) > most:
        raise QueryError(f"{name!r} must be {what} with at most {most} items")
    try:
        return [_value(name, item, schema["items"]) for item in value]
    except QueryError:
        raise QueryError(f"{name!r} must be {what}") from None


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


def _json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


# -- the SDK glue ------------------------------------------------------------------------------


def require_sdk() -> None:
    """ExtraNotInstalled, naming the extra, when the MCP SDK cannot be found (found without importing it)."""
    try:
        found = importlib.util.find_spec("mcp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ExtraNotInstalled(f"the MCP SDK (the `mcp` package) is not installed: {INSTALL}")


def build_server(client: Client, pool: Executor | None = None) -> Any:
    """The low-level SDK server: its tool list is TOOLS, its tool calls `call_tool` on `pool`'s threads.

    The pool's threads should live as long as the server (a ThreadPoolExecutor's do): an index read
    in-process keeps one connection per thread, so threads that come and go would leave connections behind.
    """
    require_sdk()
    try:
        import mcp_types as types
        from mcp.server.lowlevel import Server
    except ImportError as exc:
        raise ExtraNotInstalled(f"the MCP SDK cannot be imported ({exc.name or exc}): reinstall it with {INSTALL}") \
            from None

    tools = [types.Tool(name=t.name, description=t.description, input_schema=t.input_schema,
                        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True,
                                                          open_world_hint=False))
             for t in TOOLS]
    workers = pool or ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="clawmem-mcp")

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(workers, call_tool, client, params.name, params.arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=answer.text)],
                                    structured_content=answer.data, is_error=answer.error)

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = _BY_NAME.get(name)
        return None if spec is None else spec.input_schema

    return Server("clawmem", version=__version__, title="clawmem memory", instructions=INSTRUCTIONS,
                  get_tool_input_schema=input_schema, on_list_tools=list_tools, on_call_tool=on_call_tool)


def _to_stderr(line: str) -> None:
    """Where `serve` says what it does: stdout belongs to the protocol in stdio mode."""
    print(line, file=sys.stderr, flush=True)


def serve(client: Client, *, http: bool = False, port: int = 0, token: tuple[str, Path, bool] | None = None,
          announce: Callable[[str], None] | None = None) -> int:
    """Serve until the host hangs up (stdio) or a signal stops the server (HTTP); returns the exit status.

    Over HTTP every request needs the bearer token (clawmem_index.mcp.http): `token` is what `load_token`
    gave, else the default token file is read (made on first use). Where it is is said on start; the
    token never is.
    """
    say = announce or _to_stderr
    pool = ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="clawmem-mcp")
    server = build_server(client, pool)
    try:
        if http:
            from clawmem_index.mcp.http import load_token

            secret, where, created = token or load_token()
            # uvicorn stops gracefully on SIGTERM, then raises the signal again: end with status 0 then.
            signal.signal(signal.SIGTERM, _exit_quietly)
            listener = _listen(port)
            say(f"clawmem: MCP server (Streamable HTTP) for {client.workspace} at"
                f" http://{HOST}:{listener.getsockname()[1]}{PATH}")
            say(f"clawmem: every request needs 'Authorization: Bearer <token>', the token in {where}"
                + (" (just created)" if created else ""))
            asyncio.run(_serve_http(server, listener, secret))
        else:
            asyncio.run(_serve_stdio(server))
    except KeyboardInterrupt:
        pass
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()
    return 0


def _exit_quietly(signum: int, frame: object) -> None:
    raise SystemExit(0)


async def _serve_stdio(server: Any) -> None:
    import io

    import anyio
    from mcp.server.stdio import stdio_server

    stdin = anyio.wrap_file(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"))
    async with stdio_server(stdin=_RepairedLines(stdin)) as (read_stream, write_stream):  # type: ignore[arg-type]
        await server.run(read_stream, write_stream, server.create_initialization_options())


class _RepairedLines:
    """Input lines with escaped lone surrogates (`\\ud800`, valid JSON) made storable before the SDK parses them.

    The SDK's JSON parser refuses such a line and answers nothing, so the host would wait forever;
    repaired, the request is served (the lone surrogate becomes U+FFFD, as everywhere in clawmem).
    """

    def __init__(self, lines: Any) -> None:
        self._lines = lines

    async def __aiter__(self) -> Any:
        async for line in self._lines:
            yield _repair_line(line)


def _repair_line(line: str) -> str:
    if "\\ud" not in line.lower():
        return line
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return line  # not JSON: the SDK answers that as it does
    return json.dumps(_repaired(message), ensure_ascii=False)


async def _serve_http(server: Any, listener: socket.socket, token: str) -> None:
    import uvicorn

    from clawmem_index.mcp.http import build_app

    app = build_app(server, token, path=PATH, host=HOST)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    await uvicorn.Server(config).serve(sockets=[listener])


def _listen(port: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1 only (port 0: the system picks a free one)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None
    return listener
