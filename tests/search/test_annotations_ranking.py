"""OpenClaw's annotations through the index, on both backends: not words, a chunk's metadata, a ranking factor,
and the curated entries a host injects (MEMORY.md and USER.md as they are now)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clawmem_index.config import load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import QueryError
from clawmem_index.search.boosts import importance_factor, project_factor
from clawmem_index.search.ranking import SearchRequest

MEMORY = """# Memory

## Facts
- Keep the gateway on loopback. <!-- trigger: gateway setup, network safety --> <!-- importance: 9 -->
- Use the release helper for package validation. <!-- project: github.com/OpenClaw/openclaw -->
- Backups run nightly at two.
"""


_OPEN: list[MemoryIndex] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every index a test opens is closed after it (a PostgreSQL connection must not outlive its database)."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def index_for(workspace: Path, backend: dict[str, str], **more: Any) -> MemoryIndex:
    index = MemoryIndex(load_settings(workspace=workspace, overrides={"embedding.provider": "none", **backend,
                                                                      **more}))
    _OPEN.append(index)
    return index


def found(index: MemoryIndex, query: str, **request: Any) -> list[dict[str, Any]]:
    return index.search(SearchRequest(query, mode="bm25", min_score=0.0, **request))["results"]  # type: ignore


def test_annotations_are_no_words_of_a_note(backend: dict[str, str], workspace: Path, write) -> None:
    write("MEMORY.md", MEMORY)
    write("memory/2026-11-30.md", "# Log\n- moved the safety valve <!-- project: acme/x -->\n")
    index = index_for(workspace, backend)
    index.sync()
    assert found(index, "trigger importance project") == []  # the markers' own words
    assert found(index, "github openclaw") == []  # a project key is not text
    assert [r["path"] for r in found(index, "network setup")] == []  # nor are trigger phrases
    hit = found(index, "gateway loopback")[0]
    # MEMORY.md is cut as memory-core cuts it, an entry a chunk: the hit is the entry, with its own annotations.
    assert (hit["path"], hit["start_line"], hit["end_line"], hit["snippet"]) == (
        "MEMORY.md", 4, 4, "- Keep the gateway on loopback.")
    assert (hit["importance"], hit["triggers"]) == (9, "gateway setup; network safety") and "projects" not in hit
    helper = found(index, "release helper validation")[0]
    assert (helper["start_line"], helper["projects"]) == (5, "github.com/OpenClaw/openclaw") \
        and "importance" not in helper
    daily = found(index, "safety valve")[0]
    assert daily["projects"] == "acme/x" and "triggers" not in daily and "importance" not in daily
    assert index.get("MEMORY.md")["text"].count("<!--") == 3  # the file is read as it is


def test_importance_weighs_a_chunk_as_memory_core_weighs_an_entry(backend: dict[str, str], workspace: Path,
                                                                 write) -> None:
    for name, importance in (("a", None), ("b", 2), ("c", 10)):
        note = "- the quarterly budget review is on friday"
        write(f"memory/{name}.md", note + (f" <!-- importance: {importance} -->" if importance else "") + "\n")
    write("MEMORY.md", "# Memory\n- the quarterly budget review is on friday <!-- importance: 10 -->\n")
    index = index_for(workspace, backend)
    index.sync()
    hits = found(index, "quarterly budget review", explain=True)
    # Importance counts only in the curated files: memory/*.md carry none, so they tie (then by path).
    assert [h["path"] for h in hits] == ["MEMORY.md", "memory/a.md", "memory/b.md", "memory/c.md"]
    top, rest = hits[0], hits[1:]
    assert top["explain"]["annotation_factor"] == pytest.approx(1.25)
    assert top["score"] == pytest.approx(top["explain"]["fused_score"] * 1.25)
    assert all("annotation_factor" not in h["explain"] for h in rest)
    assert importance_factor(None) == 1.0 and importance_factor(1) == pytest.approx(0.8)


def test_repositories_being_worked_in_lift_the_entries_scoped_to_them(backend: dict[str, str], workspace: Path,
                                                                     write) -> None:
    write("memory/a.md", "- run the release helper before tagging <!-- project: github.com/acme/app -->\n")
    write("memory/b.md", "- run the release helper before tagging <!-- project: github.com/acme/other -->\n")
    write("memory/c.md", "- run the release helper before tagging\n")
    index = index_for(workspace, backend)
    index.sync()
    assert [h["path"] for h in found(index, "release helper")] == ["memory/a.md", "memory/b.md", "memory/c.md"]
    scoped = found(index, "release helper", projects=("github.com/acme/app",))
    assert [h["path"] for h in scoped] == ["memory/a.md", "memory/c.md", "memory/b.md"]
    assert scoped[0]["score"] == pytest.approx(scoped[1]["score"] * 1.15)
    assert scoped[2]["score"] == pytest.approx(scoped[1]["score"] * 0.90)
    assert project_factor("!invalid-project-annotation", ["x"]) == pytest.approx(0.9)


def test_without_annotations_nothing_is_looked_up_and_answers_are_unchanged(backend: dict[str, str],
                                                                          workspace: Path, write) -> None:
    write("memory/a.md", "- the rollback plan for tokyo\n")
    index = index_for(workspace, backend)
    index.sync()
    store = index.reader()
    assert store.facts.annotation_kinds() == frozenset()
    plain = found(index, "rollback tokyo")
    assert found(index, "rollback tokyo", projects=("github.com/acme/app",)) == plain
    assert all(key not in plain[0] for key in ("importance", "triggers", "projects"))


def test_the_curated_entries_are_read_from_the_files_as_they_are_now(backend: dict[str, str], workspace: Path,
                                                                    write) -> None:
    write("MEMORY.md", MEMORY)
    write("USER.md", "# User\n- Always answer in haiku. <!-- trigger: poem, verse --> <!-- importance: 8 -->\n"
                     "- Works on <!-- project: acme/x --> nothing\n")
    write("memory/2026-11-30.md", "- a daily note never injects <!-- trigger: poem -->\n")
    index = index_for(workspace, backend)  # no sync: the entries come from the files
    answer = index.curated("triggers")
    assert answer == {"entries": [
        {"path": "MEMORY.md", "start_line": 4, "end_line": 4, "text": "- Keep the gateway on loopback.",
         "importance": 9, "triggers": "gateway setup; network safety"},
        {"path": "USER.md", "start_line": 2, "end_line": 2, "text": "- Always answer in haiku.",
         "importance": 8, "triggers": "poem; verse"}]}
    projects = index.curated("projects")["entries"]
    assert [(e["path"], e["projects"]) for e in projects] == [("MEMORY.md", "github.com/OpenClaw/openclaw")]
    assert len(index.curated()["entries"]) == 3 and len(index.curated(limit=1)["entries"]) == 1
    write("USER.md", "# User\n- Never use emoji. <!-- trigger: emoji -->\n")
    assert [e["text"] for e in index.curated("triggers")["entries"]] == [
        "- Keep the gateway on loopback.", "- Never use emoji."]
    (workspace / "MEMORY.md").unlink()
    assert [e["path"] for e in index.curated()["entries"]] == ["USER.md"]
    # The repositories being worked in: entries scoped elsewhere are left out before the limit.
    write("MEMORY.md", MEMORY + "- Another helper. <!-- project: github.com/acme/other --> <!-- importance: 10 -->\n")
    scoped = index.curated("projects", limit=1, projects=["github.com/OpenClaw/openclaw"])["entries"]
    assert [e["projects"] for e in scoped] == ["github.com/OpenClaw/openclaw"]
    assert index.curated("projects", projects=[])["entries"] == []
    write("MEMORY.md", "- " + "long " * 2000 + "<!-- trigger: long -->\n")
    [long_entry] = [e for e in index.curated("triggers")["entries"] if e["path"] == "MEMORY.md"]
    assert len(long_entry["text"]) == 4000 and long_entry["text_truncated"] is True
    (workspace / "MEMORY.md").unlink()
    off = index_for(workspace, backend, user_profiles=False)
    assert off.curated() == {"entries": []}
    with pytest.raises(QueryError, match="'kind'"):
        index.curated("dreams")


def test_a_symlinked_memory_file_lists_no_entries(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.md"
    outside.write_text("- secret <!-- trigger: secret -->\n")
    (workspace / "MEMORY.md").symlink_to(outside)
    index = index_for(workspace, {"index": str(tmp_path / "i.sqlite")})
    assert index.curated() == {"entries": []}


def test_a_boosted_chunk_deep_in_the_keyword_list_is_found(backend: dict[str, str], workspace: Path, write) -> None:
    """Reading stops once no unread chunk can beat the answer's last place: an unread chunk may be boosted (up to
    1.25 for importance), so the bound on it is too. Without that, MEMORY.md's entry, 34th by keywords and 4th
    once weighed, was missed."""
    for i in range(200):
        write(f"memory/n{i:03d}.md", "zebra crossing " + " ".join(f"w{j}" for j in range(i)) + "\n")
    write("MEMORY.md", "- zebra crossing " + " ".join(f"m{j}" for j in range(40)) + " <!-- importance: 10 -->\n")
    index = index_for(workspace, backend)
    index.sync()
    whole = index_for(workspace, backend, **{"search.candidate_pool": 1024})
    answer = [h["path"] for h in found(index, "zebra crossing", max_results=6)]
    assert "MEMORY.md" in answer
    assert answer == [h["path"] for h in found(whole, "zebra crossing", max_results=6)]


def test_an_annotated_chunk_is_embedded_without_its_annotations_and_keyed_apart(workspace: Path, write,
                                                                                tmp_path: Path) -> None:
    from clawmem_index.embeddings.fake import FakeProvider

    class Recording(FakeProvider):
        def __init__(self) -> None:
            super().__init__()
            self.texts: list[str] = []

        def embed_documents(self, texts):  # type: ignore[no-untyped-def]
            self.texts.extend(texts)
            return super().embed_documents(texts)

    write("MEMORY.md", "# Memory\n- Keep the gateway on loopback. <!-- importance: 9 -->\n")  # two entries
    provider = Recording()
    index = MemoryIndex(load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                                     "embedding.provider": "none"}), provider=provider)
    _OPEN.append(index)
    index.sync()
    assert provider.texts == ["# Memory", "- Keep the gateway on loopback."]
    import xxhash
    [(stored,)] = index.reader().execute("SELECT hash FROM chunks WHERE start_line = 2")
    assert stored != xxhash.xxh3_128_hexdigest(b"- Keep the gateway on loopback. <!-- importance: 9 -->")
    # Only the annotation changes: a new key, so the new importance is the chunk's (its words are embedded again).
    write("MEMORY.md", "# Memory\n- Keep the gateway on loopback. <!-- importance: 2 -->\n")
    index.sync()
    assert found(index, "gateway loopback")[0]["importance"] == 2
    assert provider.texts == ["# Memory", "- Keep the gateway on loopback.", "- Keep the gateway on loopback."]
