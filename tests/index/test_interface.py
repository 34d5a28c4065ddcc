"""Both index stores implement the one interface, `IndexStore`, with the same parameter names and defaults."""

from __future__ import annotations

import inspect

import pytest

from clawmem_index.index.interface import IndexStore, SharedReads
from clawmem_index.index.pg.store import PgStore
from clawmem_index.index.store import Store

METHODS = sorted(name for name, value in vars(IndexStore).items() if callable(value) and not name.startswith("_"))


def _shape(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


def test_the_interface_names_what_the_engine_uses() -> None:
    """The engine and the search are type-checked against the interface (mypy --strict, tests/test_code_rules.py),
    so a store method they use outside it fails the build; a shared index's reads of other workspaces are a
    capability of their own, asked for by `SharedReads`, which only the PostgreSQL store has."""
    assert {"transaction", "insert_chunk", "text_search", "vector_search", "file_stat"} <= set(METHODS)
    shared = [name for name, value in vars(SharedReads).items() if callable(value) and not name.startswith("_")]
    assert shared == ["visible", "chunk_lines"]
    assert all(_shape(getattr(PgStore, name)) == _shape(getattr(SharedReads, name)) for name in shared)
    assert not set(shared) & set(dir(Store)), "a SQLite index holds one workspace"


@pytest.mark.parametrize("store", [Store, PgStore], ids=["sqlite", "postgres"])
def test_a_store_implements_all_of_it_with_the_same_parameters(store: type) -> None:
    missing = [name for name in METHODS if not callable(getattr(store, name, None))]
    assert not missing, f"{store.__name__} lacks {missing}"
    differ = [name for name in METHODS if _shape(getattr(store, name)) != _shape(getattr(IndexStore, name))]
    assert not differ, f"{store.__name__} differs from IndexStore in {differ}"
    properties = [name for name, value in vars(IndexStore).items() if isinstance(value, property)]
    assert "terms_of" in properties
    for attribute in [*IndexStore.__annotations__, *properties]:
        assert hasattr(store, attribute) or attribute in store.__annotations__, f"{store.__name__}.{attribute}"
