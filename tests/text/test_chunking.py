from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawmem_index.text.chunking import Chunk, chunk_markdown, split_lines
from clawmem_index.text.tokens import count_tokens

TEXT = st.characters(exclude_categories=("Cs",))

markdown_line = st.one_of(
    st.builds(lambda level, words: "#" * level + " " + words, st.integers(1, 6), st.text(TEXT, max_size=40)),
    st.builds(lambda words: "- " + words, st.text(TEXT, max_size=120)),
    st.just("```"),
    st.just(""),
    st.just("> quoted text"),
    st.text(TEXT, max_size=200),
    st.text(st.sampled_from("记忆系统日本語のテキスト한국어"), min_size=1, max_size=300),
    st.builds(lambda n: "word " * n, st.integers(0, 600)),
)


def markdown_docs() -> st.SearchStrategy[str]:
    return st.builds(
        lambda lines, newline, crlf: ("\r\n" if crlf else "\n").join(lines) + ("\n" if newline else ""),
        st.lists(markdown_line, max_size=60),
        st.booleans(),
        st.booleans(),
    )


def assert_exact_lines(text: str, chunks: list[Chunk]) -> None:
    lines = split_lines(text)
    for chunk in chunks:
        assert 1 <= chunk.start_line <= chunk.end_line <= len(lines)
        expected = "\n".join(lines[chunk.start_line - 1:chunk.end_line])
        if chunk.start_line == chunk.end_line and chunk.text != expected:
            assert chunk.text in expected  # a piece of an oversize line
        else:
            assert chunk.text == expected


def assert_covers_every_line(text: str, chunks: list[Chunk]) -> None:
    """Every line with something in it is in a chunk; no chunk is only whitespace."""
    lines = split_lines(text)
    covered = set()
    for c in chunks:
        covered.update(range(c.start_line, c.end_line + 1))
        assert c.text.strip(), (c.start_line, c.end_line)
    assert {n for n, line in enumerate(lines, start=1) if line.strip()} <= covered <= set(range(1, len(lines) + 1))


@settings(max_examples=int(os.environ.get("CLAWMEM_HYPOTHESIS_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(markdown_docs(), st.sampled_from([(400, 80), (64, 16), (32, 0)]))
def test_any_markdown_gives_exact_line_ranges_within_the_token_bound(text: str, bounds: tuple[int, int]) -> None:
    max_tokens, overlap = bounds
    chunks = chunk_markdown(text, max_tokens=max_tokens, overlap=overlap)
    assert_exact_lines(text, chunks)
    assert_covers_every_line(text, chunks)
    for chunk in chunks:
        assert count_tokens(chunk.text) <= max_tokens
        assert chunk.tokens >= count_tokens(chunk.text)


def test_empty_file_has_no_chunks() -> None:
    assert chunk_markdown("") == []


def test_file_without_trailing_newline_keeps_its_last_line() -> None:
    chunks = chunk_markdown("# a\nfirst\nlast line")
    assert chunks[-1].end_line == 3
    assert chunks[-1].text.endswith("last line")


def test_a_single_huge_line_is_cut_into_pieces_that_rebuild_it() -> None:
    line = "alpha beta gamma 記憶 " * 2000
    chunks = chunk_markdown(f"# title\n{line}\nafter", max_tokens=100, overlap=20)
    pieces = [c for c in chunks if c.start_line == c.end_line == 2]
    assert len(pieces) > 10
    assert "".join(p.text for p in pieces) == line
    assert all(count_tokens(p.text) <= 100 for p in pieces)
    assert chunks[-1].text.endswith("after")


def test_windows_overlap_by_whole_trailing_lines() -> None:
    text = "\n".join(f"- note number {i} about the deployment pipeline" for i in range(200))
    chunks = chunk_markdown(text, max_tokens=100, overlap=30)
    assert len(chunks) > 3
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt.start_line <= prev.end_line  # repeats the end of the previous chunk
        repeated = "\n".join(split_lines(text)[nxt.start_line - 1:prev.end_line])
        assert count_tokens(repeated) <= 30 + 2


def test_level_one_and_two_headings_start_a_chunk_once_it_has_substance() -> None:
    body = "a sentence with some substance to it. " * 4
    text = f"# Title\n{body}\n## Preferences\n{body}\n## Decisions\n{body}\n### Detail\n{body}"
    chunks = chunk_markdown(text, max_tokens=100, overlap=20)
    assert [c.start_line for c in chunks] == [1, 3, 5]
    assert chunks[2].text.startswith("## Decisions") and chunks[2].text.endswith(body)


def test_tiny_sections_are_kept_together() -> None:
    text = "# Title\n## Preferences\n- tea\n## Decisions\n- sqlite\n## Facts\n- host"
    chunks = chunk_markdown(text)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 7)]


def test_a_long_section_breaks_at_a_block_boundary_not_mid_paragraph() -> None:
    para = "This sentence belongs to one paragraph and should stay with it. " * 3
    text = "\n\n".join([para] * 30)
    lines = split_lines(text)
    chunks = chunk_markdown(text, max_tokens=120, overlap=0)
    for c in chunks[:-1]:
        next_line = lines[c.end_line] if c.end_line < len(lines) else ""
        assert next_line == "" or lines[c.end_line - 1] == ""


def _doc(sections: list[list[str]]) -> str:
    out = []
    for i, paragraphs in enumerate(sections):
        out.append(f"## Section {i}")
        out.append("")
        for p in paragraphs:
            out.extend([p, ""])
    return "\n".join(out)


def test_editing_one_paragraph_changes_only_the_chunks_that_overlap_it() -> None:
    sections = [[f"Paragraph {s}.{p} " + "lorem ipsum dolor sit amet " * 12 for p in range(8)] for s in range(4)]
    before = chunk_markdown(_doc(sections), max_tokens=200, overlap=40)
    sections[2][5] = "Paragraph 2.5 was rewritten entirely with different words " * 3
    after_text = _doc(sections)
    after = chunk_markdown(after_text, max_tokens=200, overlap=40)

    edited_line = split_lines(after_text).index(sections[2][5]) + 1
    old_hashes = {c.hash for c in before}
    changed = [c for c in after if c.hash not in old_hashes]
    assert changed, "the edit must produce a new chunk"
    for c in changed:
        # every new chunk lies in the edited section, and the first of them covers the edit
        assert c.text.count("## Section 2") <= 1 and "## Section 3" not in c.text
    assert any(c.start_line <= edited_line <= c.end_line for c in changed)
    # chunks before the edit and in other sections kept their text and hash
    untouched_before = [c for c in before if c.end_line < edited_line - 40]
    assert all(c.hash in {a.hash for a in after} for c in untouched_before)
    section3 = [c for c in before if "Paragraph 3." in c.text and "Paragraph 2." not in c.text]
    assert section3 and all(c.hash in {a.hash for a in after} for c in section3)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_crlf_files_keep_their_line_numbers(newline: str) -> None:
    text = newline.join(["# T", "a", "b", "", "## U", "c"]) + newline
    chunks = chunk_markdown(text, max_tokens=16, overlap=0)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 4), (5, 6)]
    assert_exact_lines(text, chunks)


def test_lone_carriage_return_does_not_shift_lines() -> None:
    text = "# T\nabc\rdef\n## U\nlast"
    chunks = chunk_markdown(text, max_tokens=16, overlap=0)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 2), (3, 4)]


def test_chunk_hash_is_xxh3_128_of_the_text() -> None:
    import xxhash

    chunk = chunk_markdown("# hello\nworld")[0]
    assert chunk.hash == xxhash.xxh3_128_hexdigest(chunk.text.encode())


class CountingEncoding:
    """The real tokenizer, counting how many characters it is asked to encode."""

    def __init__(self) -> None:
        from clawmem_index.text.tokens import get_encoding

        self._inner = get_encoding("cl100k_base")
        self.encoded_chars = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.encoded_chars += len(text)
        return self._inner.encode_ordinary(text)

    def decode_bytes(self, tokens: list[int]) -> bytes:
        return self._inner.decode_bytes(tokens)

    def decode_single_token_bytes(self, token: int) -> bytes:
        return self._inner.decode_single_token_bytes(token)


@pytest.mark.parametrize("line", [
    "lorem ipsum dolor sit amet " * 40_000,  # words: ~1 MB
    "x" * 1_000_000,  # one run without a break
    " " * 999_999 + "x",  # whitespace, where BPE is slowest
    "记忆系统" * 250_000,
], ids=["words", "one-run", "whitespace", "cjk"])
def test_a_huge_line_is_tokenised_a_bounded_number_of_times(line: str) -> None:
    """Linear chunking: each character is encoded a few times at most, however long the line.

    Cutting a line by re-encoding the rest after each piece (what chunking did before) encodes a
    1 MB line hundreds of times over.
    """
    from clawmem_index.text.chunking import _priorities, chunk_lines

    encoding = CountingEncoding()
    chunks = chunk_lines(split_lines(line), max_tokens=400, overlap=80, encoding=encoding,  # type: ignore[arg-type]
                         priorities=_priorities)
    kept = "".join(c.text for c in chunks)  # pieces of only whitespace are left out: nothing to find in them
    assert kept == line if not line[0].isspace() else (line.endswith(kept) and not line[:-len(kept)].strip())
    assert all(c.tokens <= 400 and count_tokens(c.text) == c.tokens for c in chunks)
    assert encoding.encoded_chars <= 3 * len(line)


def test_a_long_line_keeps_its_block_role_for_the_parser() -> None:
    """Only a long line's start goes to markdown-it; a blank-looking start of a non-blank line stays non-blank."""
    from clawmem_index.text.chunking import STRUCTURE_CHARS, _structural

    assert _structural("# short") == "# short"
    assert _structural("- " + "item " * 1000) == ("- " + "item " * 1000)[:STRUCTURE_CHARS]
    assert _structural(" " * 5000).isspace()
    padded = _structural(" " * 5000 + "text")
    assert len(padded) == STRUCTURE_CHARS and not padded.isspace()


def test_blank_lines_before_a_line_longer_than_a_chunk_make_no_empty_chunk() -> None:
    """SciFact's shape (a title, a blank line, one long abstract line) made 915 chunks of empty text."""
    text = "# A title\n\n" + " ".join(f"word{i}" for i in range(700)) + "\n\n   \n"
    chunks = chunk_markdown(text)
    assert chunks and all(c.text.strip() for c in chunks)
    assert chunks[0].text.startswith("# A title") and chunks[-1].end_line == 3
    assert chunk_markdown("\n \n\t\n") == []


def test_spans_are_chunked_each_on_its_own_with_the_files_line_numbers() -> None:
    from clawmem_index.text.annotations import entry_spans
    from clawmem_index.text.chunking import chunk_spans

    text = "# Memory\n\n- one\n  more of one\n- two\n## Later\n- " + "word " * 900 + "\n"
    spans = entry_spans(text)
    chunks = chunk_spans(text, spans, max_tokens=64, overlap=8)
    lines = text.split("\n")
    for chunk in chunks:
        assert any(first <= chunk.start_line <= chunk.end_line <= last for first, last in spans)  # never across two
        assert chunk.text == "\n".join(lines[chunk.start_line - 1:chunk.end_line]) or chunk.start_line == chunk.end_line
        assert chunk.tokens <= 64
    assert [(c.start_line, c.end_line, c.text) for c in chunks[:4]] == [
        (1, 2, "# Memory\n"), (3, 4, "- one\n  more of one"), (5, 5, "- two"), (6, 6, "## Later")]
    assert len([c for c in chunks if c.start_line == 7]) > 1  # an entry over the budget is cut in token windows
