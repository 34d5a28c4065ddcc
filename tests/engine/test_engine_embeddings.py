"""The engine with real embedding providers: cache, deferred and pending embeddings, model switches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fake_http import FakeServer, Reply, fake_server, no_proxy, openai_reply

from clawmem_index.config import EmbeddingSettings, Settings, load_settings
from clawmem_index.embeddings.base import ProviderBase, ProviderInfo
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.embeddings.openai import OpenAIProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.engine.sync import SyncReport
from clawmem_index.index.store import Store
from clawmem_index.search.ranking import SearchRequest

__all__ = ["fake_server", "no_proxy"]
pytestmark = pytest.mark.usefixtures("no_proxy")


@pytest.fixture
def server(fake_server: FakeServer) -> Iterator[FakeServer]:
    fake_server.default = openai_reply
    yield fake_server


def openai(server: FakeServer, **overrides: object) -> OpenAIProvider:
    values: dict[str, object] = {"provider": "openai", "base_url": f"{server.url}/v1", "api_key": "sk-x",
                                 "dimensions": 8, "max_retries": 1, "timeout": 5.0}
    values.update(overrides)
    return OpenAIProvider(EmbeddingSettings(**values), environ={}, sleep=lambda s: None)  # type: ignore[arg-type]


def notes(write, n: int = 5) -> None:
    for i in range(n):
        write(f"memory/n{i}.md", f"# Note {i}\nfact number {i} about the greenhouse\n")


def embedded_texts(server: FakeServer) -> list[str]:
    return [t for r in server.requests if r.path.endswith("/embeddings") for t in r.body["input"]]


def test_a_second_index_of_the_same_text_makes_no_provider_call(settings: Settings, write, server: FakeServer) -> None:
    notes(write)
    index = MemoryIndex(settings, provider=openai(server))
    index.sync()
    first = len(embedded_texts(server))
    assert first == 5 and index.reader().pending_embeddings() == 0
    index.reindex()
    write("memory/copy.md", "# Note 0\nfact number 0 about the greenhouse\n")
    index.sync()
    assert len(embedded_texts(server)) == first


def test_keyword_search_serves_through_an_outage_and_embeddings_complete_later(settings: Settings, write,
                                                                              server: FakeServer) -> None:
    notes(write)
    healthy = MemoryIndex(settings, provider=openai(server))
    server.default = lambda request: Reply(status=500, json={"error": {"message": "down"}})
    report = healthy.sync()
    assert report.embed_error is not None and report.embedded == 0
    store = healthy.reader()
    assert store.pending_embeddings() == 5
    answer = healthy.search(SearchRequest("greenhouse", min_score=0.0))
    assert answer["results"] and answer["index"]["pending_embeddings"] == 5  # type: ignore[index]
    assert healthy.status()["pending_embeddings"] == 5

    server.default = openai_reply
    restarted = MemoryIndex(settings, provider=openai(server))  # pending work survives a restart
    report = restarted.sync()
    assert report.embedded == 5 and report.embed_error is None
    assert restarted.reader().pending_embeddings() == 0
    answer = restarted.search(SearchRequest("greenhouse", min_score=0.0))
    assert answer["mode"] == "hybrid" and "warning" not in answer


def test_switching_models_rebuilds_and_switching_back_embeds_nothing(workspace: Path, write, backend) -> None:
    """On both backends: the vectors of the model left behind wait in the cache for its return."""
    settings = load_settings(workspace=workspace, overrides={"embedding.provider": "none", **backend})
    notes(write)

    filled: list[tuple[int, int]] = []

    def sync(provider: FakeProvider) -> tuple[SyncReport, str]:
        index = MemoryIndex(settings, provider=provider)
        try:
            report = index.sync(embed_progress=lambda done, total: filled.append((done, total)))
            return report, index.reader().meta.get("fingerprint") or ""
        finally:
            index.close()

    a, b, again = FakeProvider(model="fake-a"), FakeProvider(model="fake-b"), FakeProvider(model="fake-a")
    sync(a)
    assert a.documents_embedded == 5
    report, _ = sync(b)
    assert b.documents_embedded == 5 and report.chunks_kept == 5
    filled.clear()
    report, fingerprint = sync(again)
    assert again.documents_embedded == 0 and report.from_cache == 5
    if backend["index_backend"] == "postgres":
        assert filled and filled[-1] == (5, 5)  # vectors from the cache move the embedding bar too
    else:
        assert filled == []  # the parked table taken back whole: no vector waited
    assert '"model": "fake-a"' in fingerprint


def test_a_new_model_carries_the_chunks_over_and_reads_only_changed_files(settings: Settings, write) -> None:
    notes(write)
    MemoryIndex(settings, provider=FakeProvider(model="fake-a")).sync()
    edited = write("memory/n3.md", "# Note 3\nthe greenhouse roof was replaced\n")
    switched = MemoryIndex(settings, provider=FakeProvider(model="fake-b"))
    report = switched.sync()
    assert report.bytes_read == edited.stat().st_size  # the other four files were not read again
    assert (report.chunks_kept, report.updated + report.added) == (4, 1)
    assert switched.reader().pending_embeddings() == 0
    found = switched.search(SearchRequest("greenhouse", mode="bm25", min_score=0.0, max_results=10))
    assert sorted(r["path"] for r in found["results"]) == [f"memory/n{i}.md" for i in range(5)]  # type: ignore[index]
    roof = switched.search(SearchRequest("roof", mode="bm25", min_score=0.0))
    assert [r["path"] for r in roof["results"]] == ["memory/n3.md"]  # type: ignore[index]


def test_reindex_and_new_chunking_settings_read_every_file_again(settings: Settings, write, workspace: Path,
                                                                 tmp_path: Path) -> None:
    notes(write)
    total = sum(p.stat().st_size for p in (workspace / "memory").glob("*.md"))
    index = MemoryIndex(settings, provider=FakeProvider(model="fake-a"))
    index.sync()
    assert index.reindex().bytes_read == total
    rechunked = load_settings(workspace=workspace, overrides={"index": str(settings.index_path),
                                                               "embedding.provider": "none", "chunking.tokens": 200})
    assert MemoryIndex(rechunked, provider=FakeProvider(model="fake-a")).sync().bytes_read == total


class ZeroProvider(ProviderBase):
    info = ProviderInfo("zero", "zero-1", 4)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return [[0.0, 0.0, 0.0, 0.0] if "blank" in t else [1.0, 0.0, 0.0, 0.0] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return [1.0, 0.0, 0.0, 0.0]


def test_a_zero_vector_is_never_stored_as_a_match(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nblank thoughts")
    write("memory/b.md", "# B\nreal thoughts")
    index = MemoryIndex(settings, provider=ZeroProvider())
    index.sync()
    store = index.reader()
    assert store.pending_embeddings() == 0
    assert store.execute("SELECT count(*) FROM chunks_vec") == [(1,)]
    paths = [r["path"] for r in index.search(SearchRequest("anything", mode="vector", min_score=0.0))["results"]]
    assert paths == ["memory/b.md"]


def test_the_cache_is_pruned_to_max_entries(workspace: Path, write, tmp_path: Path) -> None:
    """The cache holds the vectors of texts the index no longer has; the chunks' own vectors are never pruned."""
    notes(write, 8)
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             "embedding.provider": "none",
                                                             "embedding.cache_max_entries": 3})
    index = MemoryIndex(settings, provider=FakeProvider())
    index.sync()
    for i in range(6):
        (workspace / "memory" / f"n{i}.md").unlink()
    index.sync()
    assert index.reader().execute("SELECT count(*) FROM embedding_cache") == [(3,)]
    assert index.reader().execute("SELECT count(*) FROM chunks_vec") == [(2,)]
    assert index.reader().pending_embeddings() == 0


def test_each_vector_is_stored_once(workspace: Path, write, tmp_path: Path) -> None:
    """In the chunk while a chunk holds its text, in the cache once none does, and back without a provider call."""
    notes(write, 5)
    write("memory/twin.md", "# Note 0\nfact number 0 about the greenhouse\n")  # the same text as n0.md
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             "embedding.provider": "none"})
    provider = FakeProvider()
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    store = index.reader()

    def counts() -> tuple[int, int]:
        return (store.execute("SELECT count(*) FROM chunks_vec")[0][0],
                store.execute("SELECT count(*) FROM embedding_cache")[0][0])

    assert counts() == (6, 0) and provider.documents_embedded == 5  # the twin text was embedded once
    gone = (workspace / "memory" / "n3.md").read_text()
    (workspace / "memory" / "n3.md").unlink()
    (workspace / "memory" / "twin.md").unlink()  # n0.md still holds its text: its vector stays in the chunk
    index.sync()
    assert counts() == (4, 1)
    write("memory/back.md", gone)
    index.sync()
    assert counts() == (5, 0) and provider.documents_embedded == 5


def test_vectors_are_stored_normalised_as_float32(settings: Settings, write, server: FakeServer) -> None:
    import math

    from clawmem_index.embeddings.base import unpack

    notes(write, 1)
    index = MemoryIndex(settings, provider=openai(server))
    index.sync()
    blob = index.reader().execute("SELECT embedding FROM chunks_vec")[0][0]
    vector = unpack(blob)
    assert len(blob) == 8 * 4 and math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-5)


def test_an_index_from_before_keeps_no_second_copy_once_it_embeds_again(workspace: Path, write, tmp_path: Path) -> None:
    notes(write, 3)
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             "embedding.provider": "none"})
    provider = FakeProvider()
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    key = provider.info.provider_key
    old = Store(index.path)  # as an older clawmem left it: every vector in the cache too, no owner
    with old.transaction():
        old.execute("INSERT INTO embedding_cache SELECT 'fake', ?, ?, c.hash, v.embedding, 16, 0 FROM chunks AS c"
                    " JOIN chunks_vec AS v ON v.rowid = c.seq", (provider.info.model, key))
        old.execute("DELETE FROM meta WHERE key = 'vector_owner'")
    old.close()
    assert index.reader().execute("SELECT count(*) FROM embedding_cache") == [(3,)]
    write("memory/new.md", "a new note about ferns\n")
    index.sync()
    assert index.reader().execute("SELECT count(*) FROM embedding_cache") == [(0,)]
    assert index.reader().execute("SELECT count(*) FROM chunks_vec") == [(4,)]


def test_an_embedding_pass_past_cell_min_moves_the_vectors_into_cells_and_edits_join_them(
        settings: Settings, write, monkeypatch: pytest.MonkeyPatch) -> None:
    import clawmem_index.index.vector_cells as vector_cells

    monkeypatch.setattr(vector_cells, "CELL_MIN", 200)
    for i in range(250):
        write(f"memory/n{i}.md", f"# Note {i}\nthe greenhouse log entry {i}, sensor {i * 7}\n")
    index = MemoryIndex(settings, provider=FakeProvider())
    building: list[tuple[int, int]] = []
    index.sync(vectors_progress=lambda done, total: building.append((done, total)))
    assert index.status()["vector_search"] == "k-means cells of sign bits, exact cosine rescoring"
    assert building and building[-1][0] == building[-1][1] > 250  # `clawmem index` shows the build's bar
    write("memory/new.md", "# Orchids\nthe orchids bloomed in the north bed\n")
    building.clear()
    index.sync(vectors_progress=lambda done, total: building.append((done, total)))
    assert building == []  # one more vector joins its cell: no build
    hits = index.search(SearchRequest("the orchids bloomed in the north bed", mode="vector", max_results=1,
                                      min_score=0.0))
    assert [r["path"] for r in hits["results"]] == ["memory/new.md"]  # type: ignore[index]



# -- how vectors are stored: "auto" precision -------------------------------------------------------------------


def _with_precision(settings: Settings, precision: str) -> Settings:
    import dataclasses

    return dataclasses.replace(settings, embedding=dataclasses.replace(settings.embedding, precision=precision))


def _stored(index: MemoryIndex) -> tuple[str, set[int]]:
    store = index.reader()
    [(table,)] = store.execute("SELECT name FROM sqlite_master WHERE name IN ('chunks_vec', 'chunks_vec_half')")
    return str(table), {int(n) for (n,) in store.execute(f"SELECT DISTINCT length(embedding) FROM {table}")}


@pytest.mark.parametrize(("dims", "table", "width"), [(512, "chunks_vec", 4), (768, "chunks_vec_half", 2)])
def test_by_default_vectors_wider_than_512_are_stored_at_half_precision(settings: Settings, write, dims: int,
                                                                       table: str, width: int) -> None:
    notes(write)
    assert settings.embedding.precision == "auto"
    index = MemoryIndex(settings, provider=FakeProvider(dims=dims))
    index.sync()
    assert index.precision == ("float16" if dims > 512 else "float32")
    assert _stored(index) == (table, {width * dims})
    found = index.search(SearchRequest("fact number 3", mode="vector", max_results=1, min_score=0.0))
    assert [r["path"] for r in found["results"]] == ["memory/n3.md"]  # type: ignore[index]
    index.close()


def test_an_index_stored_at_float32_moves_to_half_precision_without_calling_the_provider(settings: Settings,
                                                                                        write) -> None:
    """An index made before "auto" (float32 at 768 dimensions) keeps working: the next sync re-stores its own
    vectors at half precision, the same vectors rounded, and no text is embedded again."""
    import numpy as np

    notes(write)
    before = MemoryIndex(_with_precision(settings, "float32"), provider=FakeProvider(dims=768))
    before.sync()
    assert _stored(before) == ("chunks_vec", {4 * 768})
    old = {str(h): np.frombuffer(bytes(b), "<f4") for h, b in before.reader().execute(
        "SELECT c.hash, v.embedding FROM chunks AS c JOIN chunks_vec AS v ON v.rowid = c.seq")}
    before.close()

    provider = FakeProvider(dims=768)
    index = MemoryIndex(settings, provider=provider)
    report = index.sync()
    assert provider.document_calls == 0 and report.from_cache == 5
    assert _stored(index) == ("chunks_vec_half", {2 * 768})
    new = {str(h): np.frombuffer(bytes(b), "<f2") for h, b in index.reader().execute(
        "SELECT c.hash, v.embedding FROM chunks AS c JOIN chunks_vec_half AS v ON v.rowid = c.seq")}
    assert new.keys() == old.keys()
    assert all(np.array_equal(new[h], old[h].astype("<f2")) for h in old)
    assert index.status()["fresh"] is True
    index.close()


def test_an_index_moved_to_half_precision_is_as_small_as_one_built_so(settings: Settings, write,
                                                                      tmp_path: Path) -> None:
    """The float32 table's pages do not stay behind as free pages: the move is a rebuild into a new file."""
    import dataclasses

    for i in range(120):
        write(f"memory/n{i}.md", f"# Note {i}\n" + "\n".join(f"- fact {i}.{j} about the greenhouse" for j in range(8)))

    def pages(index: MemoryIndex) -> tuple[int, int]:
        store = index.reader()
        [(total,)] = store.execute("PRAGMA page_count")
        [(free,)] = store.execute("PRAGMA freelist_count")
        return int(total), int(free)

    before = MemoryIndex(_with_precision(settings, "float32"), provider=FakeProvider(dims=768))
    before.sync()
    at_float32 = pages(before)
    before.close()
    moved = MemoryIndex(settings, provider=FakeProvider(dims=768))
    moved.sync()
    made = MemoryIndex(dataclasses.replace(settings, index=tmp_path / "fresh.sqlite"), provider=FakeProvider(dims=768))
    made.sync()
    (total, free), (fresh_total, _) = pages(moved), pages(made)
    assert free <= total // 10, (total, free)
    assert total <= fresh_total * 1.1 and total < at_float32[0], (total, fresh_total, at_float32)
    moved.close()
    made.close()


def test_precision_auto_is_float32_on_the_shared_index(tmp_path: Path) -> None:
    shared = load_settings(workspace=tmp_path, overrides={"index_backend": "postgres",
                                                          "index_url": "postgresql://u@127.0.0.1/db"})
    assert shared.embedding.precision == "auto" and shared.vector_precision(1536) == "float32"
    local = load_settings(workspace=tmp_path, overrides={"embedding.precision": "float32"})
    assert local.vector_precision(1536) == "float32"
