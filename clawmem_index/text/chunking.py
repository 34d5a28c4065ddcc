"""Markdown text -> chunks with exact 1-based line ranges. Pure: no I/O, no state.

How a file is cut:
- A heading of level 1 or 2 starts a new chunk once the current one holds a quarter of
  `max_tokens`, so an edit in one section does not move the chunks of the next (their text and
  hash stay the same; only their line numbers may shift), while tiny sections are kept together
  rather than cut into fragments too small to carry meaning.
- Inside a section, lines are packed greedily up to `max_tokens`; when a chunk must end early it
  ends at the best boundary in the second half of its window: a smaller heading, then any block
  start (paragraph, list item, fence, quote), then any line.
- The next chunk of the same section repeats the last whole lines of the previous one, up to
  `overlap` tokens.
- A single line over `max_tokens` is cut into pieces by token windows on character boundaries;
  each piece keeps that line's number, and the pieces joined give the line back.
Every chunk's token count is checked on its final text, so the bound holds for any input, and the
cost is linear in the input: a line too long to fit (by its length alone) is never encoded whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import xxhash

from clawmem_index.text.tokens import MAX_TOKEN_BYTES, split_by_tokens

if TYPE_CHECKING:
    import tiktoken

__all__ = ["Chunk", "chunk_markdown", "split_lines"]

HARD = 4
HEADING = 3
BLOCK = 2
LINE = 1


@dataclass(frozen=True, slots=True)
class Chunk:
    """`tokens` bounds the text's token count from above (exact when the chunk is near the bound)."""

    start_line: int
    end_line: int
    text: str
    hash: str
    tokens: int


def split_lines(text: str) -> list[str]:
    """The file's lines as editors number them: split on '\\n' only, no phantom line after a final newline."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def chunk_markdown(text: str, *, max_tokens: int = 400, overlap: int = 80,
                   tokenizer: str = "cl100k_base") -> list[Chunk]:
    from clawmem_index.text.tokens import get_encoding

    return chunk_lines(split_lines(text), max_tokens=max_tokens, overlap=overlap, encoding=get_encoding(tokenizer),
                       priorities=_priorities)


def chunk_spans(text: str, spans: Sequence[tuple[int, int]], *, max_tokens: int = 400, overlap: int = 80,
                tokenizer: str = "cl100k_base") -> list[Chunk]:
    """Each span of lines (1-based, inclusive) chunked on its own, its chunks numbered as the file's lines: a file
    whose entries are its units (OpenClaw's MEMORY.md and USER.md: one entry, one chunk, cut only past the budget)."""
    from clawmem_index.text.tokens import get_encoding

    lines = split_lines(text)
    encoding = get_encoding(tokenizer)
    chunks: list[Chunk] = []
    for first, last in spans:
        for chunk in chunk_lines(lines[first - 1:last], max_tokens=max_tokens, overlap=overlap, encoding=encoding,
                                 priorities=_priorities):
            chunks.append(replace(chunk, start_line=chunk.start_line + first - 1, end_line=chunk.end_line + first - 1))
    return chunks


def chunk_lines(
    lines: Sequence[str],
    *,
    max_tokens: int,
    overlap: int,
    encoding: tiktoken.Encoding,
    priorities: Callable[[Sequence[str]], list[int]],
) -> list[Chunk]:
    if not lines:
        return []
    count = encoding.encode_ordinary
    # A line longer than MAX_TOKEN_BYTES * max_tokens characters cannot fit (its bytes alone make more
    # tokens): it is cut without counting it whole. +1 on every cost: the line break.
    too_long = MAX_TOKEN_BYTES * max_tokens
    costs = [max_tokens + 1 if len(line) > too_long else len(count(line)) + 1 for line in lines]
    prio = priorities(lines)
    min_section = max_tokens // 4
    chunks: list[Chunk] = []
    section_start = 0
    section_cost = 0
    for i in range(1, len(lines) + 1):
        section_cost += costs[i - 1]
        if i == len(lines) or (prio[i] == HARD and section_cost >= min_section):
            _pack_section(lines, costs, prio, section_start, i, max_tokens, overlap, encoding, chunks)
            section_start, section_cost = i, 0
        elif prio[i] == HARD:
            prio[i] = HEADING
    return chunks


def _pack_section(
    lines: Sequence[str], costs: list[int], prio: list[int], start: int, end: int,
    max_tokens: int, overlap: int, encoding: tiktoken.Encoding, out: list[Chunk],
) -> None:
    i = start
    while i < end:
        total = 0
        j = i
        while j < end and total + costs[j] <= max_tokens:
            total += costs[j]
            j += 1
        if j == i:
            out.extend(_split_long_line(lines[i], i + 1, max_tokens, encoding))
            i += 1
            continue
        k = _best_break(prio, i, j) if j < end else j
        k = _emit(lines, i, k, costs, max_tokens, encoding, out)
        if k >= end:
            return
        back = k
        carried = 0
        while back - 1 > i and carried + costs[back - 1] <= overlap and prio[back - 1] != HARD:
            back -= 1
            carried += costs[back]
        i = back


def _best_break(prio: list[int], i: int, j: int) -> int:
    """Where a full window [i, j) should end: the strongest boundary in its second half, latest wins."""
    lo = i + max(1, (j - i) // 2)
    best, best_prio = j, LINE
    for k in range(j, lo - 1, -1):
        if k < len(prio) and prio[k] > best_prio:
            best, best_prio = k, prio[k]
            if best_prio >= HEADING:
                break
    return best


def _emit(lines: Sequence[str], i: int, k: int, costs: list[int], max_tokens: int,
          encoding: tiktoken.Encoding, out: list[Chunk]) -> int:
    """Append the chunk of lines [i, k), shrinking it if its real token count is over the bound.

    The sum of the lines' own counts bounds the joined text's count except where tokens merge
    across a line break; allowing one token per break, only chunks within that slack of the bound
    are encoded again to check.
    """
    estimate = sum(costs[i:k])
    while True:
        text = "\n".join(lines[i:k])
        if estimate + (k - i) <= max_tokens:
            n = estimate
            break
        n = len(encoding.encode_ordinary(text))
        if n <= max_tokens or k - i == 1:
            break
        k -= 1
        estimate -= costs[k]
    if n > max_tokens:
        out.extend(_split_long_line(lines[i], i + 1, max_tokens, encoding))
        return i + 1
    if text.strip():  # blank lines alone (before a long line, say) make no chunk: nothing in them to find
        out.append(Chunk(i + 1, k, text, _hash(text), n))
    return k


def _split_long_line(line: str, lineno: int, max_tokens: int, encoding: tiktoken.Encoding) -> list[Chunk]:
    return [Chunk(lineno, lineno, piece, _hash(piece), n) for piece, n in split_by_tokens(line, max_tokens, encoding)
            if piece.strip()]


def _hash(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


@functools.cache
def _parser():  # type: ignore[no-untyped-def]
    from markdown_it import MarkdownIt

    # Only the block rules whose boundaries matter for chunking. markdown-it's list rule alone costs
    # 3x the rest, so list items are found by their marker (outside fences) instead; setext headings
    # and quotes are rare in memory files and only cost time here.
    md = MarkdownIt("zero").enable(["heading", "fence", "hr", "paragraph"])
    md.disable(["inline", "text_join"], ignoreInvalid=True)
    return md


STRUCTURE_CHARS = 1024  # a line's block role shows in its start; markdown-it walks leading blanks in Python


def _structural(line: str) -> str:
    """The start of a long line, enough for its block role (blank or not, its marker), at a bounded cost."""
    if len(line) <= STRUCTURE_CHARS:
        return line
    head = line[:STRUCTURE_CHARS]
    return head[:-1] + "." if head.isspace() and not line.isspace() else head


_LIST_ITEM = re.compile(r" {0,3}(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")


def _priorities(lines: Sequence[str]) -> list[int]:
    """Break priority of each line start, from markdown-it's block tokens and their line maps."""
    prio = [LINE] * len(lines)
    # markdown-it also breaks lines on a lone '\r'; blank it so its line numbers stay ours.
    source = "\n".join(map(_structural, lines)).replace("\r", " ")
    in_fence = bytearray(len(lines))
    for token in _parser().parse(source):
        if token.map is None or token.nesting == -1:
            continue
        begin, end = token.map
        if begin >= len(prio):
            continue
        if token.type == "heading_open":
            prio[begin] = HARD if token.tag in ("h1", "h2") else max(prio[begin], HEADING)
        elif prio[begin] < BLOCK:
            prio[begin] = BLOCK
        if token.type == "fence":
            in_fence[begin + 1:end] = b"\x01" * len(in_fence[begin + 1:end])
    for i, line in enumerate(lines):
        if prio[i] < BLOCK and not in_fence[i] and _LIST_ITEM.match(line):
            prio[i] = BLOCK
    return prio
