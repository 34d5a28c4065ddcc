"""Terms as FTS5 sees them, for BM25 computed inside PostgreSQL.

PostgreSQL's own text search stems differently and ranks without BM25, so the shared index keeps
what FTS5 would: each chunk's terms from FTS5's own `porter unicode61 remove_diacritics 2`
tokenizer (through apsw, so both backends tokenize alike), with their counts and the chunk's token
count. A query's FTS5 expression (as `keywords` builds it) is read back into phrases: a word, a
prefix (`"stag"*`), or a pair of CJK characters, which the index keeps as one bigram term.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass

import apsw

from clawmem_index.text.keywords import index_text

__all__ = ["ChunkTerms", "Phrase", "chunk_terms", "phrases_of"]

_PHRASE = re.compile(r'"((?:[^"]|"")+)"(\*?)')
_CJK_CHAR = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\U00020000-\U0002ebef]")
_local = threading.local()


@dataclass(frozen=True, slots=True)
class ChunkTerms:
    terms: list[str]  # distinct, in first-seen order
    counts: list[int]  # occurrences of each
    length: int  # tokens (what BM25's document length counts)


@dataclass(frozen=True, slots=True)
class Phrase:
    term: str  # a stemmed word, a CJK bigram ("東 京"), or a prefix
    prefix: bool = False


def _tokens(text: str, *, query: bool = False) -> list[str]:
    tokenizer = getattr(_local, "tokenizer", None)
    if tokenizer is None:
        _local.conn = apsw.Connection(":memory:")
        tokenizer = _local.conn.fts5_tokenizer("porter", ["unicode61", "remove_diacritics", "2"])
        _local.tokenizer = tokenizer
    flags = apsw.FTS5_TOKENIZE_QUERY if query else apsw.FTS5_TOKENIZE_DOCUMENT
    encoded = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()
    return list(tokenizer(encoded, flags, None, include_offsets=False, include_colocated=False))


def _bigrams(tokens: list[str]) -> list[str]:
    return [f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False)
            if len(a) == 1 and len(b) == 1 and _CJK_CHAR.match(a) and _CJK_CHAR.match(b)]


def chunk_terms(text: str) -> ChunkTerms:
    """A chunk's terms and counts as FTS5 indexes `index_text(text)`, CJK character pairs included."""
    spaced = index_text(text)
    tokens = _tokens(spaced)
    counts = Counter(tokens)
    if _CJK_CHAR.search(spaced):  # pairs only where there are CJK characters (a scan of pairs costs more)
        counts.update(_bigrams(tokens))
    return ChunkTerms(list(counts), list(counts.values()), len(tokens))


def phrases_of(match: str) -> list[Phrase]:
    """The phrases of an OR of quoted phrases (what `keywords.build_match` makes), each as one term.

    A phrase the tokenizer splits into more than one token is matched as its first pair's bigram
    (CJK pairs) or, for anything else, by its tokens joined with a space, which matches nothing:
    `keywords` never builds such a phrase from a user's words.
    """
    phrases: list[Phrase] = []
    for body, star in _PHRASE.findall(match):
        tokens = _tokens(body.replace('""', '"'), query=True)
        if not tokens:
            continue
        term = tokens[0] if len(tokens) == 1 else " ".join(tokens[:2])
        phrases.append(Phrase(term, prefix=bool(star)))
    return phrases
