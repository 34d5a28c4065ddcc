"""Every client sends what the daemon takes: the socket's parameter table (service.params.PARAMS) is the one
place a request's parameters are written, and each client (the Python Client and DaemonClient, the Node client
and its types, the MCP tools) is checked against it here, so none can drift from it unnoticed (issue 48)."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from daemon_helpers import short_dir

from clawmem_index.api import Client
from clawmem_index.mcp.server import TOOLS
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.client import request_params
from clawmem_index.service.params import PARAMS

ROOT = Path(__file__).resolve().parents[2]
NODE_CLIENT = ROOT / "integrations" / "clawmem-client"


def snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), name)


def every_field() -> SearchRequest:
    return SearchRequest("q", max_results=3, min_score=0.1, mode="bm25", path_prefix="memory/", source="memory",
                         since="2026-01-01", before="2026-12-01", explain=True, workspaces=("a",), now="2026-12-07",
                         projects=("github.com/acme/app",))


def test_the_python_client_takes_every_parameter_the_daemon_does() -> None:
    for method in ("search", "context"):
        taken = {name for name, p in inspect.signature(getattr(Client, method)).parameters.items() if name != "self"}
        assert taken == set(PARAMS[method]), f"Client.{method} differs from the socket's {method}"


def test_the_daemon_client_sends_every_field_of_a_request() -> None:
    assert set(request_params(every_field())) == set(PARAMS["search"])
    assert set(request_params(every_field(), for_context=True)) | {"budget"} == set(PARAMS["context"])


def test_the_node_clients_types_name_every_parameter() -> None:
    types = (NODE_CLIENT / "index.d.ts").read_text()

    def fields(interface: str) -> set[str]:
        body = re.search(rf"export interface {interface}[^{{]*\{{(.*?)\n\}}", types, re.DOTALL)
        assert body is not None, interface
        return {snake(m) for m in re.findall(r"^\s+(\w+)\?:", body.group(1), re.MULTILINE)}

    assert fields("SearchOptions") | {"query"} == set(PARAMS["search"])
    context = fields("ContextOptions") | (fields("SearchOptions") - {"explain", "projects"}) | {"query"}
    assert context == set(PARAMS["context"])


NODE = """
import { ClawmemClient } from %(client)s;
const client = new ClawmemClient({ socketPath: process.argv[2], timeoutMs: 10_000 });
const all = { maxResults: 3, minScore: 0.1, mode: "bm25", pathPrefix: "memory/", source: "memory",
  since: "2026-01-01", before: "2026-12-01", explain: true, workspaces: ["a"], now: "2026-12-07",
  projects: ["github.com/acme/app"] };
await client.search("q", all);
const { explain, projects, ...forContext } = all;
await client.context("q", { ...forContext, budget: 100 });
client.close();
"""


def test_the_node_client_sends_every_parameter_the_daemon_takes(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: the Node client's tests need it (CI installs Node)")
    seen: list[dict[str, object]] = []
    for sock_dir in short_dir():
        path = sock_dir / "p.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(4)
        listener.settimeout(30)

        def serve() -> None:  # one request per connection (the client's way now), answered at once
            for _ in range(2):
                conn, _ = listener.accept()  # noqa: B023 (the one socket folder short_dir yields)
                with conn, conn.makefile("rwb") as f:
                    request = json.loads(f.readline())
                    seen.append(request)
                    f.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {}}).encode() + b"\n")
                    f.flush()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        script = tmp_path / "send.mjs"
        script.write_text(NODE % {"client": json.dumps(str(NODE_CLIENT / "index.js"))})
        out = subprocess.run([node, str(script), str(path)], capture_output=True, text=True, timeout=60)
        thread.join(30)
        listener.close()
        assert out.returncode == 0, out.stderr
    by_method = {r["method"]: set(r["params"]) for r in seen}  # type: ignore[arg-type]
    assert by_method == {"search": set(PARAMS["search"]), "context": set(PARAMS["context"])}


def test_the_mcp_tools_take_only_parameters_the_daemon_does() -> None:
    """The tools keep OpenClaw's names (maxResults) and a subset; each maps onto one the socket takes."""
    tools = {tool.name: tool.input_schema["properties"] for tool in TOOLS}
    for tool, method in (("memory_search", "search"), ("memory_context", "context"), ("memory_get", "get")):
        assert {snake(name) for name in tools[tool]} <= set(PARAMS[method]), tool
