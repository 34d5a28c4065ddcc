"""Repeated searches are answered from the cache, and any change to the index, from anywhere, misses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawmem_index.config import Settings, with_overrides
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.search.query_cache import QueryCache
from clawmem_index.search.ranking import SearchRequest


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_are_bounded_least_recently_used_first_and_expire() -> None:
    clock = Clock()
    cache: QueryCache[str] = QueryCache(entries=2, ttl=10.0, clock=clock)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # now b is the least recently used
    cache.put("c", "C")
    assert (cache.get("b"), cache.get("a"), cache.get("c")) == (None, "A", "C")
    clock.now = 10.5
    assert cache.get("a") is None and len(cache) == 1
    off: QueryCache[str] = QueryCache(entries=0, ttl=10.0)
    off.put("a", "A")
    assert off.get("a") is None


def paths(index: MemoryIndex, query: str) -> list[str]:
    return [r["path"] for r in index.search(SearchRequest(query, min_score=0.0))["results"]]  # type: ignore[index]


def test_a_repeated_search_embeds_its_query_once(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nthe staging server is fra-2\n")
    provider = FakeProvider(dims=16)
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    first = index.search(SearchRequest("staging server"))
    calls = provider.query_calls
    assert index.search(SearchRequest("staging server")) == first
    assert provider.query_calls == calls
    index.search(SearchRequest("staging server", max_results=3))  # another request: its own answer
    assert provider.query_calls == calls + 1
    off = MemoryIndex(with_overrides(settings, search={"cache_entries": 0}), provider=provider)
    off.search(SearchRequest("staging server"))
    off.search(SearchRequest("staging server"))
    assert provider.query_calls == calls + 3
    index.close()
    off.close()


def test_a_change_by_this_index_or_by_another_process_misses(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nkiwi launch plan\n")
    index = MemoryIndex(settings, provider=FakeProvider(dims=16))
    index.sync()
    assert paths(index, "kiwi") == ["memory/a.md"]
    write("memory/b.md", "# B\nkiwi budget\n")
    index.sync()
    assert sorted(paths(index, "kiwi")) == ["memory/a.md", "memory/b.md"]
    # Another writer (its own connection, as another process would have) changes the index.
    other = MemoryIndex(settings, provider=FakeProvider(dims=16))
    Path(settings.workspace / "memory" / "a.md").unlink()
    other.sync()
    other.close()
    assert paths(index, "kiwi") == ["memory/b.md"]
    index.close()


def test_an_answer_degraded_by_a_failing_provider_is_not_kept(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nkiwi launch plan\n")
    provider = FakeProvider(dims=16)
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    provider.fail = True
    assert "warning" in index.search(SearchRequest("kiwi"))
    provider.fail = False
    answer = index.search(SearchRequest("kiwi"))
    assert "warning" not in answer and answer["mode"] == "hybrid"
    index.close()


def test_a_large_answer_is_not_kept(settings: Settings, write: Any) -> None:
    from clawmem_index.engine.query import CACHED_RESULTS

    for i in range(CACHED_RESULTS + 5):
        write(f"memory/n{i}.md", f"# Note {i}\nkiwi number {i}\n")
    provider = FakeProvider(dims=16)
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    big = SearchRequest("kiwi", max_results=CACHED_RESULTS + 5, min_score=0.0)
    assert len(index.search(big)["results"]) > CACHED_RESULTS  # type: ignore[arg-type]
    calls = provider.query_calls
    index.search(big)
    assert provider.query_calls == calls + 1
    index.close()
