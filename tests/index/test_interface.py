"""Both index stores implement the one interface, `IndexStore`, with the same parameter names and defaults."""

from __future__ import annotations

import inspect

import pytest

from clawmem_index.index.interface import IndexStore
from clawmem_index.index.pg.store import PgStore
from clawmem_index.index.store import Store

METHODS = sorted(name for name, value in vars(IndexStore).items() if callable(value) and not name.startswith("_"))


def _shape(function: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


def test_the_interface_names_what_the_engine_uses() -> None:
    assert len(METHODS) >= 50 and {"transaction", "insert_chunk", "text_search", "vector_search"} <= set(METHODS)


@pytest.mark.parametrize("store", [Store, PgStore], ids=["sqlite", "postgres"])
def test_a_store_implements_all_of_it_with_the_same_parameters(store: type) -> None:
    missing = [name for name in METHODS if not callable(getattr(store, name, None))]
    assert not missing, f"{store.__name__} lacks {missing}"
    differ = [name for name in METHODS if _shape(getattr(store, name)) != _shape(getattr(IndexStore, name))]
    assert not differ, f"{store.__name__} differs from IndexStore in {differ}"
    for attribute in ("terms_of", "caches_stored_vectors"):
        assert hasattr(store, attribute)
