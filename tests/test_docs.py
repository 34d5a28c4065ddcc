"""The documentation, tested against the code it describes, so that it cannot drift (sqlite-utils' tests/test_docs.py
is the model): every command's reference is its own --help, and every setting, socket method and parameter, MCP tool
and its arguments, `Client` method and parameter, and table and column of the index is named on its page; every link
between the pages lands on a page and a heading that exist."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import apsw
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def docs_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_script", ROOT / "scripts" / "docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_is_each_command_s_own_help() -> None:
    script = docs_script()
    text = page("cli.md")
    assert script.with_reference(text) == text, "docs/cli.md's reference is out of date: python scripts/docs.py"
    from clawmem_index.cli import cli

    for name in cli.commands:
        assert f"### `clawmem {name}`" in text, name


def test_the_check_fails_when_the_reference_drifts(tmp_path: Path) -> None:
    """The check itself: a reference that says something the commands do not is found."""
    script = docs_script()
    drifted = page("cli.md").replace("Search the memory for QUERY.", "Search the memory.")
    assert script.with_reference(drifted) != drifted
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs.py"), "--check"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_every_socket_method_and_parameter_is_on_the_socket_api_page() -> None:
    from clawmem_index.service.params import PARAMS

    text = page("socket-api.md")
    rows = {}  # method -> its row of the table (a row may name several: "| `sync`, `reindex` |")
    for row in re.finditer(r"^\| ((?:`\w+`(?:, )?)+) \|.*$", text, re.MULTILINE):
        rows.update(dict.fromkeys(re.findall(r"`(\w+)`", row.group(1)), row.group(0)))
    for method, params in PARAMS.items():
        assert method in rows, f"socket method {method} is not in docs/socket-api.md's table"
        for param in params:
            assert re.search(rf"`{param}\??`", rows[method]), f"{method}'s parameter {param} is not in its row"


def test_every_mcp_tool_and_argument_is_on_the_mcp_page() -> None:
    from clawmem_index.mcp.server import TOOLS

    text = page("mcp.md")
    for tool in TOOLS:
        row = re.search(rf"^\| `{tool.name}` \|.*$", text, re.MULTILINE)
        assert row, f"MCP tool {tool.name} is not in docs/mcp.md's table"
        for argument in tool.input_schema["properties"]:
            assert re.search(rf"`{argument}\??`", row.group(0)), f"{tool.name}'s argument {argument}"


def test_every_client_method_and_parameter_is_on_the_client_page() -> None:
    from clawmem_index import Client

    text = page("python-client.md")
    documented = {m.group(1): m.group(2) for m in re.finditer(r"`(\w+)\(([^`]*)\)`", text)}
    for name, method in [("Client", Client), *inspect.getmembers(Client, inspect.isfunction)]:
        if name.startswith("_"):
            continue
        assert name in documented, f"Client.{name} is not on docs/python-client.md"
        for param in list(inspect.signature(method).parameters)[1 if name != "Client" else 0:]:
            if param != "self":
                assert re.search(rf"\b{param}\b", documented[name]), f"{name}'s parameter {param}"


def test_every_table_and_column_of_the_index_is_on_the_schema_page(tmp_path: Path) -> None:
    from clawmem_index.index.schema import migrate

    conn = apsw.Connection(str(tmp_path / "i.sqlite"))
    migrate(conn)
    text = page("schema.md")
    tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if not re.match(r"chunks_fts_", name)]  # FTS5's own shadow tables
    assert "chunks" in tables and "files" in tables
    for table in tables:
        columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]
        row = re.search(rf"^\| `{table}[(`].*$", text, re.MULTILINE)
        assert row, f"table {table} is not in docs/schema.md"
        if table != "chunks_fts":  # its columns are named in the row's text
            for column in columns:
                assert re.search(rf"[(, ]{column}[,)]", row.group(0)), f"{table}.{column}"


def test_every_setting_of_a_settings_class_is_on_the_settings_page() -> None:
    from clawmem_index.config import Settings

    def names(cls: type) -> list[str]:
        found = []
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if dataclasses.is_dataclass(field.type) or (isinstance(field.default_factory, type)  # type: ignore[misc]
                                                         and dataclasses.is_dataclass(field.default_factory)):
                found += names(field.default_factory)  # type: ignore[arg-type]
            elif field.name not in ("workspace", "config_file"):
                found.append(field.name)
        return found

    text = page("settings.md")
    missing = [name for name in names(Settings) if f"`{name}`" not in text]
    assert not missing, f"settings not in docs/settings.md: {missing}"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces as -."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-"))
    return found


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_lands_on_a_page_and_a_heading_that_exist(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address (none may name a registry host; tests/test_readme.py)
        path, _, anchor = target.partition("#")
        landing = (doc.parent / path).resolve() if path else doc
        assert landing.exists(), f"{doc.name}: {target} does not exist"
        if anchor and landing.suffix == ".md":
            assert anchor in _anchors(landing.read_text(encoding="utf-8")), f"{doc.name}: no heading #{anchor}"


def test_the_readme_is_an_introduction_and_links_every_page() -> None:
    """The manual lives under docs/: the README says what clawmem is, gives the two commands and a first search,
    and links every page of the guide."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for doc in sorted(DOCS.glob("*.md")):
        if doc.name != "benchmarks-history.md":
            assert f"(docs/{doc.name}" in readme, f"the README does not link docs/{doc.name}"
