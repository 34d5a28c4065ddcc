"""Terms as FTS5 sees them, for BM25 computed inside PostgreSQL.

PostgreSQL's own text search stems differently and ranks without BM25, so the shared index keeps
what FTS5 would: each chunk's terms from FTS5's own `porter unicode61 remove_diacritics 2`
tokenizer (through apsw, so both backends tokenize alike), with their counts and the chunk's token
count. A query's FTS5 expression (as `keywords` builds it) is read back into phrases: a word, a
prefix (`"stag"*`), or a pair of CJK characters, which the index keeps as one bigram term.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from clawmem_index.index.pg.connection import pg_text
from clawmem_index.text.keywords import index_text
from clawmem_index.text.stemming import tokens as fts5_tokens

__all__ = ["ChunkTerms", "Phrase", "chunk_terms", "chunk_terms_of", "phrase_count", "phrases_of"]

_PHRASE = re.compile(r'"((?:[^"]|"")+)"(\*?)')
_CJK_CHAR = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\U00020000-\U0002ebef]")


@dataclass(frozen=True, slots=True)
class ChunkTerms:
    terms: list[str]  # distinct, in first-seen order
    counts: list[int]  # occurrences of each
    length: int  # tokens (what BM25's document length counts)


@dataclass(frozen=True, slots=True)
class Phrase:
    term: str  # a stemmed word, a CJK bigram ("東 京"), a prefix, or the words of a quoted phrase joined
    prefix: bool = False
    words: tuple[str, ...] = ()  # a quoted phrase's tokens, matched only next to each other, in order


def phrase_count(tokens: list[str], words: tuple[str, ...]) -> int:
    """How often `words` occur in `tokens` next to each other, in order (FTS5's hits of a phrase)."""
    n = len(words)
    first = words[0]
    return sum(1 for i, token in enumerate(tokens) if token == first and tuple(tokens[i:i + n]) == words)


def _bigrams(tokens: list[str]) -> list[str]:
    return [f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False)
            if len(a) == 1 and len(b) == 1 and _CJK_CHAR.match(a) and _CJK_CHAR.match(b)]


def chunk_terms(text: str) -> ChunkTerms:
    """A chunk's terms and counts as FTS5 indexes `index_text(text)`, CJK character pairs included."""
    spaced = index_text(text)
    found = fts5_tokens(spaced)
    counts = Counter(found)
    if _CJK_CHAR.search(spaced):  # pairs only where there are CJK characters (a scan of pairs costs more)
        counts.update(_bigrams(found))
    return ChunkTerms(list(counts), list(counts.values()), len(found))


def phrases_of(match: str) -> list[Phrase]:
    """The phrases of an OR of quoted phrases (what `keywords.build_match` makes).

    A phrase the tokenizer splits into more than one token is a pair of CJK characters (matched as
    the bigram the index keeps), or words the user quoted (`words`: matched next to each other).
    """
    phrases: list[Phrase] = []
    for body, star in _PHRASE.findall(match):
        found = fts5_tokens(body.replace('""', '"'), query=True)
        if not found:
            continue
        if len(found) > 1 and not all(len(t) == 1 and _CJK_CHAR.match(t) for t in found):
            phrases.append(Phrase(" ".join(found), prefix=bool(star), words=tuple(found)))
            continue
        term = found[0] if len(found) == 1 else " ".join(found[:2])
        phrases.append(Phrase(term, prefix=bool(star)))
    return phrases


def chunk_terms_of(text: str) -> ChunkTerms:
    """A chunk's terms as the shared index keeps them (picklable: a parse worker makes them)."""
    return chunk_terms(pg_text(text))
