from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from clawmem_index.config import Settings, load_settings
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import PathError, QueryError
from clawmem_index.index.store import TextHit
from clawmem_index.search.ranking import Candidate, SearchRequest, fuse_rrf, snippet
from tests.hostile import FIXED_TEXTS, hostile_text


def answer(index: MemoryIndex, query: str, **kw) -> list[dict]:
    return index.search(SearchRequest(query, **kw))["results"]  # type: ignore[return-value]


@pytest.fixture
def starter(template_workspace: Path, tmp_path: Path) -> MemoryIndex:
    settings = load_settings(workspace=template_workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                                     "embedding.provider": "none"})
    index = MemoryIndex(settings)
    index.sync()
    return index


@pytest.mark.parametrize("query, path, line", [
    ("which staging server do deploys use", "MEMORY.md", "staging-7"),
    ("who reviews infrastructure changes?", "MEMORY.md", "Dana Whitfield"),
    ("why did we pick SQLite", "MEMORY.md", "SQLite was chosen"),
    ("what goes in the daily log before context is compacted", "AGENTS.md", None),
    ("research notes open questions sources", "memory/templates/research-notes.md", None),
    ("project risks and next steps", "memory/templates/project-tracking.md", None),
])
def test_known_answers_on_the_starter_workspace(starter: MemoryIndex, query: str, path: str, line: str | None) -> None:
    results = answer(starter, query, mode="bm25")
    if line is None:  # AGENTS.md is not memory; the templates are excluded by default: neither is ever an answer
        assert all(r["path"] != path for r in results)
        return
    assert results and results[0]["path"] == path
    assert line in results[0]["snippet"]


def test_excluded_paths_are_neither_indexed_nor_readable(workspace: Path, write, tmp_path: Path) -> None:
    write("memory/templates/daily.md", "# Template\nplaceholder walrus\n")
    write("memory/drafts/2026/x.md", "# Draft\ndraft walrus\n")
    write("memory/notes.md", "# Notes\nreal walrus\n")
    settings = load_settings(workspace=workspace, overrides={
        "index": str(tmp_path / "i.sqlite"), "embedding.provider": "none",
        "exclude": "memory/templates/**:memory/drafts/**"})
    index = MemoryIndex(settings)
    assert index.sync().files_seen == 1
    assert [r["path"] for r in answer(index, "walrus", mode="bm25")] == ["memory/notes.md"]
    with pytest.raises(PathError, match="exclude"):
        index.get("memory/templates/daily.md")
    assert index.status()["pending_files"] == 0  # excluded files are not "waiting" either
    index.close()


@pytest.mark.parametrize("pattern, key, hit", [
    ("memory/templates/**", "memory/templates/a.md", True),
    ("memory/templates/**", "memory/templates/deep/a.md", True),
    ("memory/templates/**", "memory/templatesX/a.md", False),
    ("memory/*.md", "memory/a.md", True),
    ("memory/*.md", "memory/sub/a.md", False),
    ("**/scratch-*.md", "memory/x/scratch-1.md", True),
    ("**/scratch-*.md", "scratch-1.md", True),
    ("memory/[ab].md", "memory/[ab].md", True),
])
def test_exclude_globs(pattern: str, key: str, hit: bool) -> None:
    from clawmem_index.sources.paths import excluded

    assert excluded(key, (pattern,)) is hit


def test_results_carry_exact_line_ranges(starter: MemoryIndex, template_workspace: Path) -> None:
    top = answer(starter, "staging server release branch", mode="bm25")[0]
    lines = (template_workspace / top["path"]).read_text().split("\n")
    assert "\n".join(lines[top["start_line"] - 1:top["end_line"]]) == top["snippet"]


def test_cjk_queries_find_cjk_notes(settings: Settings, write) -> None:
    write("memory/zh.md", "# 会议\n我们决定使用向量数据库来存储长期记忆。\n")
    write("memory/ja.md", "# 日記\n今日は東京で寿司を食べました。\n")
    write("memory/en.md", "# Notes\nnothing in Chinese here\n")
    index = MemoryIndex(settings)
    index.sync()
    assert answer(index, "数据库", mode="bm25")[0]["path"] == "memory/zh.md"
    assert answer(index, "长期记忆是怎么存的", mode="bm25")[0]["path"] == "memory/zh.md"
    assert answer(index, "東京", mode="bm25")[0]["path"] == "memory/ja.md"
    assert [r["path"] for r in answer(index, "寿司", mode="bm25")] == ["memory/ja.md"]


def test_snippets_are_at_most_700_characters(settings: Settings, write) -> None:
    write("memory/long.md", "# L\n" + ("tomato " * 30 + "\n") * 40)
    index = MemoryIndex(settings)
    index.sync()
    results = answer(index, "tomato", mode="bm25")
    assert results and all(len(r["snippet"]) <= 700 for r in results)


def test_path_prefix_and_max_results_filter(settings: Settings, write) -> None:
    for i in range(10):
        write(f"memory/a/{i}.md", f"# {i}\nshared keyword")
        write(f"memory/b/{i}.md", f"# {i}\nshared keyword")
    index = MemoryIndex(settings)
    index.sync()
    results = answer(index, "keyword", mode="bm25", path_prefix="memory/b/", max_results=4, min_score=0.0)
    assert len(results) == 4 and all(r["path"].startswith("memory/b/") for r in results)


def test_empty_query_and_bad_mode_are_query_errors(settings: Settings, write) -> None:
    write("memory/a.md", "x")
    index = MemoryIndex(settings)
    index.sync()
    with pytest.raises(QueryError):
        answer(index, "   ")
    with pytest.raises(QueryError):
        answer(index, "x", mode="telepathy")


def test_punctuation_only_query_finds_nothing_without_error(settings: Settings, write) -> None:
    write("memory/a.md", "x")
    index = MemoryIndex(settings)
    index.sync()
    assert answer(index, '"*()^:', mode="bm25") == []


@hsettings(max_examples=150, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=120))
def test_any_query_text_is_answered(fuzz_index: MemoryIndex, query: str) -> None:
    try:
        fuzz_index.search(SearchRequest(query, mode="bm25"))
    except QueryError:
        assert not query.strip()


@pytest.fixture(scope="module")
def fuzz_index(tmp_path_factory: pytest.TempPathFactory) -> MemoryIndex:
    ws = tmp_path_factory.mktemp("fuzzws")
    (ws / "memory").mkdir()
    (ws / "memory" / "a.md").write_text("# Notes\nsome words, 中文, ünïcödé, and ids like a828e60\n")
    index = MemoryIndex(load_settings(workspace=ws, overrides={"index": str(ws.parent / "fuzz.sqlite"),
                                                               "embedding.provider": "none"}))
    index.sync()
    return index


def hit(seq: int, bm25: float) -> TextHit:
    return TextHit(seq, f"p{seq}", "memory", 1, 1, "t", bm25)


def test_rrf_rewards_agreement_and_scales_to_one() -> None:
    both = Candidate(1, "a", "memory", 1, 1, "", text_score=1.0, vector_score=0.9)
    text_only = Candidate(2, "b", "memory", 1, 1, "", text_score=0.8)
    ranked = fuse_rrf([text_only, both], 60)
    assert ranked[0].seq == 1 and ranked[0].score == pytest.approx(1.0)


def test_snippet_cuts_on_character_boundaries() -> None:
    text = "記憶" * 600
    cut = snippet(text, 700)
    assert len(cut) <= 700 and cut.encode("utf-8")


def test_hybrid_finds_paraphrases_and_exact_ids(settings: Settings, write) -> None:
    """BM25 alone misses the paraphrase; hybrid ranks both the paraphrase and the exact id first."""
    write("memory/car.md", "# Garage\nThe automobile needs new tyres before winter.\n")
    write("memory/commit.md", "# Release\nThe fix landed in commit a828e60 yesterday.\n")
    for i in range(6):
        write(f"memory/filler{i}.md", f"# Filler {i}\nunrelated gardening note number {i}\n")
    provider = FakeProvider(synonyms={"car": "automobile", "tires": "tyres"})
    index = MemoryIndex(settings, provider=provider)
    index.sync()

    assert not [r for r in answer(index, "car tires", mode="bm25") if r["path"] == "memory/car.md"]
    assert answer(index, "car tires", mode="hybrid", min_score=0.1)[0]["path"] == "memory/car.md"
    assert answer(index, "a828e60", mode="hybrid", min_score=0.1)[0]["path"] == "memory/commit.md"
    top = index.search(SearchRequest("car tires", min_score=0.1))
    assert top["provider"] == "fake" and top["mode"] == "hybrid"
    assert top["results"][0]["vector_score"] > 0  # type: ignore[index]
    keyword = index.search(SearchRequest("car tires", mode="bm25"))
    assert (keyword["provider"], keyword["model"], keyword["mode"]) == ("fake", provider.info.model, "bm25")


@pytest.mark.parametrize("cells", [False, True])
def test_over_k_means_cells_a_hybrid_search_reads_the_keyword_side_ahead(settings: Settings, write,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        cells: bool) -> None:
    """A deeper vector read over cells costs tens of ms; 256 keyword hits spare most of them."""
    from clawmem_index.index.keyword_index import KeywordIndex
    from clawmem_index.index.vector_index import VectorIndex
    from clawmem_index.search import ranking as search

    for i in range(300):
        write(f"memory/n{i}.md", f"# Note {i}\ndeploy staging server number {i}\n")
    index = MemoryIndex(settings, provider=FakeProvider())
    index.sync()
    read: list[int] = []
    real_hits = KeywordIndex.hits
    monkeypatch.setattr(VectorIndex, "in_cells", lambda self: cells)
    monkeypatch.setattr(KeywordIndex, "hits", lambda self, ranked: read.append(len(ranked)) or real_hits(self, ranked))
    assert answer(index, "deploy staging", mode="hybrid")
    if cells:
        assert read[0] == search.TEXT_AHEAD
    else:
        assert max(read) < search.TEXT_AHEAD


def test_query_vectors_from_another_model_are_never_compared(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nthe automobile needs tyres")
    MemoryIndex(settings, provider=FakeProvider(model="fake-1")).sync()
    other = MemoryIndex(settings, provider=FakeProvider(model="fake-2"))
    answer = other.search(SearchRequest("automobile", min_score=0.0))
    assert answer["mode"] == "bm25" and "fake-1" in str(answer["warning"])
    assert answer["results"]


def test_a_search_before_any_vector_says_why_it_is_keyword_only(settings: Settings, write) -> None:
    """During a backfill the provider is fine and the vectors are not there yet: the warning says so, and does
    not claim there is no provider."""
    from clawmem_index.search.ranking import run_search

    write("memory/a.md", "# A\nthe automobile needs tyres\n")
    index = MemoryIndex(settings)
    index.sync()
    request = SearchRequest("automobile", mode="vector", min_score=0.0)
    waiting = run_search(index.reader(), FakeProvider(), request, settings.search)
    assert waiting.mode == "bm25" and waiting.results
    assert waiting.degraded is not None and waiting.degraded.startswith("no vectors stored yet")
    without = run_search(index.reader(), None, request, settings.search)
    assert without.degraded == "no embedding provider: keyword results only"


def test_a_keyword_only_index_does_not_load_a_provider(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nalpha")
    MemoryIndex(settings, provider=None).sync()
    provider = FakeProvider()
    answer = MemoryIndex(settings, provider=provider).search(SearchRequest("alpha"))
    assert provider.query_calls == 0 and answer["results"]


COMMITS = [("a828e60", "landed"), ("a828e61", "was reverted"), ("a828f60", "shipped"), ("b828e60", "broke the build"),
           ("a829e60", "was cherry-picked"), ("a828e6f", "went to staging"), ("e828a60", "fixed the cache"),
           ("a828e06", "changed the schema")]


def test_with_the_real_model_hybrid_finds_what_each_half_misses(settings: Settings, write, local_provider) -> None:
    """Keyword search misses a paraphrase, MiniLM confuses near-identical commit ids; hybrid gets both right."""
    write("memory/car.md", "# Garage\nThe automobile needs new tyres before winter.\n")
    for i, (commit, what) in enumerate(COMMITS):
        write(f"memory/commit-{i}.md", f"# Release note {i}\nCommit {commit} {what} yesterday.\n")
    for i, text in enumerate(["Bought tomatoes and basil at the market.", "The design review moved to Thursday.",
                              "Renew the passport before March.", "Dana prefers short status updates."]):
        write(f"memory/misc-{i}.md", f"# Note {i}\n{text}\n")
    index = MemoryIndex(settings, provider=local_provider)
    index.sync()

    def top(query: str, mode: str) -> str | None:
        results = answer(index, query, mode=mode)
        return results[0]["path"] if results else None

    assert top("car tires", "bm25") is None
    assert top("car tires", "hybrid") == "memory/car.md"
    assert top("a828e60", "vector") != "memory/commit-0.md"
    assert top("a828e60", "hybrid") == "memory/commit-0.md"


# -- dates, sources, recency decay, diversity ---------------------------------------------------


def test_date_bounds_apply_inside_the_candidate_queries(settings: Settings, write) -> None:
    """A post-filter of the top-k would lose the only match in the window: 30 older notes outrank it."""
    for day in range(1, 31):
        write(f"memory/2020-01-{day:02d}.md", "# Log\nwalrus walrus walrus migration\n")
    write("memory/2026-11-20.md", "# Log\none walrus seen today among many other things of note\n")
    write("MEMORY.md", "# Memory\nwalrus walrus walrus walrus\n")
    for provider in (None, FakeProvider(dims=32)):
        index = MemoryIndex(settings, provider=provider)
        index.sync()
        for mode in ("bm25", "hybrid", "vector") if provider else ("bm25",):
            found = answer(index, "walrus", mode=mode, max_results=2, min_score=0.0, since="2026-01-01")
            assert [r["path"] for r in found] == ["memory/2026-11-20.md"], mode
            found = answer(index, "walrus", mode=mode, max_results=50, min_score=0.0, before="2020-01-03")
            assert sorted(r["path"] for r in found) == ["memory/2020-01-01.md", "memory/2020-01-02.md"], mode
        index.close()


def test_a_bad_date_or_source_is_a_query_error(settings: Settings, write) -> None:
    write("memory/a.md", "# A\nwalrus\n")
    index = MemoryIndex(settings)
    index.sync()
    with pytest.raises(QueryError, match="ISO date"):
        answer(index, "walrus", since="last tuesday")
    with pytest.raises(QueryError, match="unknown source"):
        answer(index, "walrus", source="email")
    assert answer(index, "walrus", mode="bm25", min_score=0.0, source="memory")
    assert answer(index, "walrus", mode="bm25", min_score=0.0, source="sessions") == []
    index.close()


def test_decay_prefers_the_newer_of_two_equal_notes_and_never_touches_memory_md(settings: Settings,
                                                                                write) -> None:
    import datetime as dt

    from clawmem_index.config import with_overrides
    from clawmem_index.search.ranking import run_search

    for name in ("memory/2026-06-01.md", "memory/2026-11-01.md", "MEMORY.md"):
        write(name, "# Notes\nproject kiwi launch plan\n")
    index = MemoryIndex(settings)
    index.sync()
    request = SearchRequest("kiwi launch", mode="bm25", min_score=0.0)
    plain = run_search(index.reader(), None, request, settings.search).results
    assert [r.path for r in plain] == ["MEMORY.md", "memory/2026-06-01.md", "memory/2026-11-01.md"]  # a tie
    decayed_settings = with_overrides(settings, search={"decay_half_life_days": 30}).search
    decayed = run_search(index.reader(), None, request, decayed_settings, today=dt.date(2026, 11, 22)).results
    assert [r.path for r in decayed] == ["MEMORY.md", "memory/2026-11-01.md", "memory/2026-06-01.md"]
    by_path = {r.path: r.score for r in decayed}
    assert by_path["MEMORY.md"] == plain[0].score  # undated: never decays
    floor = decayed_settings.decay_floor
    assert by_path["memory/2026-11-01.md"] == pytest.approx(plain[0].score * (floor + (1 - floor) * 0.5 ** (21 / 30)))
    # By default ages count from the newest date in the index, not from the calendar: a memory left
    # alone for months does not fade as a whole.
    newest = run_search(index.reader(), None, request, decayed_settings).results
    assert {r.path: r.score for r in newest}["memory/2026-11-01.md"] == pytest.approx(plain[0].score)
    index.close()


def test_mmr_drops_a_near_duplicate(settings: Settings, write) -> None:
    from clawmem_index.config import with_overrides
    from clawmem_index.search.ranking import run_search

    write("memory/a.md", "# A\nkiwi rollout plan for the staging cluster next week\n")
    write("memory/b.md", "# B\nkiwi rollout plan for the staging cluster next week\n")
    write("memory/c.md", "# C\nkiwi budget owner is Dana\n")
    index = MemoryIndex(settings)
    index.sync()
    request = SearchRequest("kiwi rollout plan", mode="bm25", min_score=0.0, max_results=2)
    plain = run_search(index.reader(), None, request, settings.search).results
    assert sorted(r.path for r in plain) == ["memory/a.md", "memory/b.md"]
    diverse = run_search(index.reader(), None, request,
                         with_overrides(settings, search={"mmr_lambda": 0.5, "mmr_floor": 0.0}).search)
    assert [r.path for r in diverse.results] == [plain[0].path, "memory/c.md"]
    # With a relevance floor, a chunk matching one word of three is never promoted over the duplicate.
    floored = run_search(index.reader(), None, request,
                         with_overrides(settings, search={"mmr_lambda": 0.5, "mmr_floor": 0.9}).search)
    assert [r.path for r in floored.results] == [r.path for r in plain]
    index.close()


@pytest.mark.parametrize("mode", ["bm25", "hybrid", "vector"])
def test_one_citation_appears_once_in_an_answer(settings: Settings, write, mode: str) -> None:
    """The pieces of one long line share its line range: an answer names those lines once, at the best piece's rank."""
    long_line = " ".join(f"the heron study {i} found herons nesting" for i in range(200))
    write("memory/long.md", f"# Herons\n\n{long_line}\n")
    write("memory/short.md", "# Note\nherons seen at the lake\n")
    index = MemoryIndex(settings, provider=FakeProvider())
    index.sync()
    pieces = index.reader().execute("SELECT count(*) FROM chunks WHERE path = 'memory/long.md' AND start_line = 3")
    assert pieces[0][0] > 3
    results = answer(index, "herons nesting", mode=mode, max_results=20, min_score=0.0)
    cited = [(r["path"], r["start_line"], r["end_line"]) for r in results]
    assert len(cited) == len(set(cited)) and ("memory/long.md", 3, 3) in cited


def test_explain_says_how_each_result_got_its_place(settings: Settings, write) -> None:
    write("memory/car.md", "# Garage\nThe automobile needs new tyres before winter.\n")
    write("memory/tyre.md", "# Shop\nTyres on sale at the garage.\n")
    for i in range(4):
        write(f"memory/filler{i}.md", f"# Filler {i}\nunrelated gardening note number {i}\n")
    index = MemoryIndex(settings, provider=FakeProvider(synonyms={"car": "automobile", "tires": "tyres"}))
    index.sync()
    plain = index.search(SearchRequest("car tyres", min_score=0.0))["results"]
    explained = index.search(SearchRequest("car tyres", min_score=0.0, explain=True))["results"]
    assert [r["path"] for r in explained] == [r["path"] for r in plain] and "explain" not in plain[0]
    for result in explained:
        how = result["explain"]
        assert how["fusion"] == "weighted" and how["fused_score"] == result["score"]
        # the keyword side (relative to the best hit) raised to search.text_exponent, 0.5 by default
        assert how["fused_score"] == pytest.approx(0.4 * (how["keyword_score"] or 0.0) ** 0.5
                                                   + 0.6 * (how["vector_score"] or 0.0), abs=1e-5)
        assert (how["keyword_rank"] is None) == (how["keyword_score"] is None)
        assert (how["vector_rank"] is None) == (how["vector_score"] is None)
    assert {r["explain"]["keyword_rank"] for r in explained if r["explain"]["keyword_rank"]} == {1, 2}
    keyword = index.search(SearchRequest("tyres", mode="bm25", explain=True))["results"][0]["explain"]
    assert keyword["fusion"] == "bm25" and keyword["keyword_rank"] == 1 and keyword["vector_rank"] is None
    for result in index.search(SearchRequest("car tyres garage", mode="bm25", explain=True, min_score=0.0))["results"]:
        assert result["score"] == pytest.approx(result["explain"]["keyword_score"], abs=1e-5)  # no exponent

    tuned = replace(settings, search=replace(settings.search, decay_half_life_days=30.0, mmr_lambda=0.7))
    both = MemoryIndex(tuned, provider=FakeProvider()).search(SearchRequest("tyres garage", explain=True,
                                                                            min_score=0.0))["results"]
    assert all("decay_factor" in r["explain"] and "mmr" in r["explain"] for r in both)
    assert [r["explain"]["mmr"]["place_after"] for r in both] == list(range(1, len(both) + 1))


# -- stable ranking -------------------------------------------------------------------------------

VOCAB = ("kiwi mango staging deploy server budget owner dana launch plan rollout cluster fra tokyo "
         "invoice review sqlite index vector memory alpha beta gamma delta omega").split()


@pytest.fixture(scope="module")
def ranking_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[MemoryIndex, FakeProvider]:
    """Sixty notes of words drawn from a small vocabulary (so queries match many chunks, by both sides)."""
    import random

    rng = random.Random(16)
    ws = tmp_path_factory.mktemp("rankws")
    (ws / "memory" / "team").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n" + " ".join(rng.choices(VOCAB, k=12)) + "\n")
    for i in range(60):
        name = f"memory/2026-{1 + i % 12:02d}-{1 + i % 27:02d}.md" if i % 3 else f"memory/team/note-{i}.md"
        lines = [" ".join(rng.choices(VOCAB, k=rng.randint(3, 14))) for _ in range(rng.randint(1, 4))]
        with (ws / name).open("a") as fh:
            fh.write("\n".join(lines) + "\n")
    # Synonyms make the sides disagree: a note can be near a query by vector and hold none of its words.
    provider = FakeProvider(dims=32, synonyms={"mango": "kiwi", "tokyo": "fra", "omega": "alpha",
                                               "invoice": "budget", "rollout": "launch", "cluster": "server"})
    index = MemoryIndex(load_settings(workspace=ws, overrides={"index": str(ws.parent / "rank.sqlite")}),
                        provider=provider)
    index.sync()
    return index, provider


@hsettings(max_examples=120, deadline=None)
@given(words=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4),
       mode=st.sampled_from(["hybrid", "bm25", "vector"]),
       fusion=st.sampled_from(["weighted", "rrf"]), pool=st.integers(1, 4), k=st.integers(1, 10),
       extra=st.integers(1, 30), min_score=st.sampled_from([0.0, 0.2, 0.3]),
       mmr_lambda=st.sampled_from([0.0, 0.5, 0.7]), decay=st.sampled_from([0.0, 30.0]),
       prefix=st.sampled_from([None, "memory/", "memory/team/"]), since=st.sampled_from([None, "2026-04-01"]),
       when=st.sampled_from(["", "yesterday", "on March 4", "last month", "in 2026", "stagng", "budgte"]),
       cap=st.sampled_from([1024, 8]))
def test_the_first_k_results_are_the_first_k_of_any_larger_answer(
        ranking_corpus: tuple[MemoryIndex, FakeProvider], words: list[str], mode: str, fusion: str, pool: int,
        k: int, extra: int, min_score: float, mmr_lambda: float, decay: float, prefix: str | None,
        since: str | None, when: str, cap: int) -> None:
    """Days the query names (a third list, read whole or cut at `cap`) and typos read as words keep it so."""
    from clawmem_index.config import with_overrides
    from clawmem_index.search.ranking import run_search

    index, provider = ranking_corpus
    tuned = with_overrides(index.settings, search={
        "fusion": fusion, "candidate_pool": pool, "mmr_lambda": mmr_lambda, "mmr_pool": 8,
        "decay_half_life_days": decay, "candidate_cap": max(cap, pool)}).search

    def first(n: int) -> list[tuple[str, int, float]]:
        request = SearchRequest(" ".join([*words, when]), max_results=n, min_score=min_score, mode=mode,
                                path_prefix=prefix, since=since, now="2026-03-05")
        return [(r.path, r.start_line, round(r.score, 9))
                for r in run_search(index.reader(), provider, request, tuned).results]

    small, large = first(k), first(k + extra)
    assert large[:k] == small


@pytest.mark.parametrize("mode", ["hybrid", "bm25"])
def test_when_nothing_matches_the_beginnings_of_the_words_are_searched(settings: Settings, write, mode: str) -> None:
    from clawmem_index.config import with_overrides

    write("memory/a.md", "# Deploys\nthe staging server is fra-2, commit a828e60\n")
    write("memory/b.md", "# Other\nlunch options near the office\n")
    settings = with_overrides(settings, search={"correct_typos": False})  # the fallback alone (typos: test_spelling)
    index = MemoryIndex(settings, provider=FakeProvider(dims=512))
    index.sync()
    for typo in ("stagng", "a828e"):
        answer = index.search(SearchRequest(typo, mode=mode, min_score=0.3))
        assert answer["mode"] == "prefix" and [r["path"] for r in answer["results"]] == ["memory/a.md"]  # type: ignore[index]
    assert index.search(SearchRequest("staging", mode=mode))["mode"] == mode  # found as typed: no fallback
    off = MemoryIndex(with_overrides(settings, search={"prefix_fallback": False}), provider=FakeProvider(dims=512))
    assert off.search(SearchRequest("stagng", mode=mode, min_score=0.3))["results"] == []
    # A vector search asked for matches by meaning: word beginnings are not that, so it never falls back.
    vector = index.search(SearchRequest("stagng", mode="vector", min_score=0.3))
    assert vector["mode"] == "vector" and vector["results"] == []
    index.close()
    off.close()


def test_a_typo_is_embedded_as_the_word_it_was_read_as(settings: Settings, write) -> None:
    """The vector side embeds the query as meant ("read", not "fead"): a model places the misspelled word nowhere
    near the note; a query without a typo is embedded as typed."""

    class Recording(FakeProvider):
        def __init__(self) -> None:
            super().__init__()
            self.queries: list[str] = []

        def embed_query(self, text: str) -> list[float]:
            self.queries.append(text)
            return super().embed_query(text)

    for i in range(4):
        write(f"memory/fear{i}.md", f"# Note {i}\nShe spoke of her fear of heights, time {i}.\n")
    write("memory/books.md", "# Books\nShe likes to read books about sailing.\n")
    provider = Recording()
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    answer = index.search(SearchRequest("Which books did she fead?", mode="hybrid"))
    assert answer["query"] == {"corrected": [{"word": "fead", "read_as": ["read"]}]}
    assert index.search(SearchRequest("fead", mode="hybrid"))["query"] == {
        "corrected": [{"word": "fead", "read_as": ["fear"]}]}, "alone, the most common reading"
    index.search(SearchRequest("books about sailing", mode="hybrid"))
    assert provider.queries == ["Which books did she read?", "fear", "books about sailing"]
    index.close()


def test_an_early_return_skips_the_query_vector_only_when_keywords_decide(settings: Settings, write) -> None:
    from clawmem_index.config import with_overrides

    write("memory/a.md", "# Deploys\ncommit a828e60 fixed the staging deploy\n")
    write("memory/b.md", "# Deploys\nthe staging deploy failed twice\n")
    provider = FakeProvider(dims=64)
    index = MemoryIndex(with_overrides(settings, search={"early_return_ratio": 2.0, "cache_entries": 0}),
                        provider=provider)
    index.sync()
    answer = index.search(SearchRequest("a828e60"))
    assert answer["mode"] == "bm25" and provider.query_calls == 0
    assert [r["path"] for r in answer["results"]] == ["memory/a.md"]  # type: ignore[index]
    assert index.search(SearchRequest("staging deploy"))["mode"] == "hybrid"  # two close matches: embedded
    assert provider.query_calls == 1
    plain = MemoryIndex(with_overrides(settings, search={"cache_entries": 0}), provider=provider)
    assert plain.search(SearchRequest("a828e60"))["mode"] == "hybrid"  # off by default
    index.close()
    plain.close()


@hsettings(max_examples=150, deadline=None)
@given(query=st.one_of(st.sampled_from(list(FIXED_TEXTS.values())), hostile_text()),
       mode=st.sampled_from(["hybrid", "bm25", "vector"]), mmr=st.sampled_from([0.0, 0.7]))
def test_hostile_queries_get_an_answer_or_a_query_error_through_every_stage(
        ranking_corpus: tuple[MemoryIndex, FakeProvider], query: str, mode: str, mmr: float) -> None:
    """Fusion, the proof's deeper reads, the prefix fallback, MMR and the cache, on any text."""
    from clawmem_index.config import with_overrides

    index, provider = ranking_corpus
    tuned = MemoryIndex(with_overrides(index.settings, search={"mmr_lambda": mmr, "candidate_pool": 2}),
                        provider=provider)
    try:
        for _ in range(2):  # the second answer comes from the cache
            try:
                answer = tuned.search(SearchRequest(query[:2000], mode=mode))
            except QueryError:
                assert not query[:2000].strip()  # the only query a search refuses: one with nothing to search
                break
            assert answer["mode"] in ("hybrid", "bm25", "vector", "prefix")
    finally:
        tuned.close()


def test_the_vector_side_reads_ahead_so_the_proofs_deeper_reads_need_no_second_search() -> None:
    from clawmem_index.index.store import ChunkFilter, VectorHit
    from clawmem_index.search.ranking import READ_AHEAD, _VectorSide

    class Vectors:
        def __init__(self, size: int) -> None:
            self.hits = [VectorHit(i, f"p{i}", "memory", 1, 1, "", i / 1000) for i in range(size)]
            self.asked: list[tuple[int, int | None]] = []

        def search(self, blob: bytes, limit: int, where: ChunkFilter, *,
                   candidates_for: int | None = None) -> list[VectorHit]:
            self.asked.append((limit, candidates_for))
            return self.hits[:limit]

    vectors = Vectors(1000)
    side = _VectorSide(vectors, b"", ChunkFilter())  # type: ignore[arg-type]
    assert [h.seq for h in side.hits(10)] == list(range(10))
    assert len(side.hits(20)) == 20 and len(side.hits(10 * READ_AHEAD)) == 10 * READ_AHEAD
    assert vectors.asked == [(10 * READ_AHEAD, 10)]  # one search, its prefilter sized for the depth asked
    assert len(side.hits(100)) == 100
    assert vectors.asked[-1] == (100 * READ_AHEAD, 100)
    small = Vectors(15)
    side = _VectorSide(small, b"", ChunkFilter())  # type: ignore[arg-type]
    assert len(side.hits(10)) == 10 and len(side.hits(80)) == 15
    assert len(small.asked) == 1  # it had everything there is
