"""Both index stores implement the one interface: `IndexStore`'s core and each of its parts, with the same
parameter names and defaults, and no store method that only hands a call on to a part."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from clawmem_index.index import interface
from clawmem_index.index.interface import IndexStore, SharedReads
from clawmem_index.index.pg.store import PgStore
from clawmem_index.index.store import Store

PARTS = {name: value.fget.__annotations__["return"] for name, value in vars(IndexStore).items()  # type: ignore[union-attr]
         if isinstance(value, property) and name != "terms_of"}


def _methods(protocol: type) -> list[str]:
    return sorted(name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_"))


def _shape(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
            if p.name != "self"]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    if request.param == "sqlite":
        opened: Store | PgStore = Store(tmp_path / "index.sqlite")
    else:
        opened = PgStore(request.getfixturevalue("pg_url"), "alpha")
    request.addfinalizer(opened.close)
    return opened


def test_the_interface_is_a_core_and_small_parts() -> None:
    """The engine and the search are type-checked against the interface (mypy --strict, tests/test_code_rules.py),
    so a store method they use outside it fails the build; a shared index's reads of other workspaces are a
    capability of their own, asked for by `SharedReads`, which only the PostgreSQL store has."""
    assert set(PARTS) == {"meta", "keywords", "vectors", "embeddings", "cache", "carry", "batch_jobs", "facts"}
    sizes = {part: len(_methods(getattr(interface, protocol))) for part, protocol in PARTS.items()}
    assert all(1 <= n <= 8 for n in sizes.values()), sizes
    assert {"transaction", "insert_chunk", "file_stat", "data_version"} <= set(_methods(IndexStore))
    assert len(_methods(IndexStore)) <= 20, "the store itself is its transactions, files and chunks"
    shared = _methods(SharedReads)
    assert shared == ["chunk_lines", "visible"]
    assert all(_shape(getattr(PgStore, name)) == _shape(getattr(SharedReads, name)) for name in shared)
    assert not set(shared) & set(dir(Store)), "a SQLite index holds one workspace"


def test_a_store_implements_its_core_with_the_same_parameters(store: object) -> None:
    methods = _methods(IndexStore)
    missing = [name for name in methods if not callable(getattr(store, name, None))]
    assert not missing, f"{type(store).__name__} lacks {missing}"
    differ = [name for name in methods if _shape(getattr(store, name)) != _shape(getattr(IndexStore, name))]
    assert not differ, f"{type(store).__name__} differs from IndexStore in {differ}"
    for attribute in [*IndexStore.__annotations__, "terms_of"]:
        assert hasattr(store, attribute), f"{type(store).__name__}.{attribute}"


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_store_implements_each_part_with_the_same_parameters(store: object, part: str) -> None:
    protocol = getattr(interface, PARTS[part])
    held = getattr(store, part)
    for name in _methods(protocol):
        assert callable(getattr(held, name, None)), f"{type(store).__name__}.{part} lacks {name}"
        assert _shape(getattr(held, name)) == _shape(getattr(protocol, name)), f"{type(store).__name__}.{part}.{name}"


def _hands_on(method: ast.FunctionDef) -> str | None:
    """The part a method only hands its call on to (`return self.<part>.<name>(...)`), if that is all it does."""
    body = [node for node in method.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)) or not isinstance(body[0].value, ast.Call):
        return None
    called = body[0].value.func
    if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Attribute) \
            and isinstance(called.value.value, ast.Name) and called.value.value.id == "self":
        return called.value.attr
    return None


@pytest.mark.parametrize("kind", [Store, PgStore], ids=["sqlite", "postgres"])
def test_no_store_hands_a_part_s_calls_on(kind: type) -> None:
    """A part's methods are called on the part: the store does not repeat them (a new backend writes each once)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(kind)))
    methods = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    handed = {method.name: part for method in methods if (part := _hands_on(method)) in PARTS}
    assert not handed, f"{kind.__name__} hands these on to its parts: {handed}"
    assert any(_hands_on(method) for method in methods), "the check reads the store's methods"
