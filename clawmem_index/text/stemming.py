"""Words as the keyword index keeps them: FTS5's own `porter unicode61 remove_diacritics 2` tokenizer.

Both stores keep stems made by this tokenizer (the SQLite index inside FTS5, the shared index in
`cm_terms`), so a word is looked up in either by the token this returns. One in-memory SQLite
connection a thread lends the tokenizer (apsw's tokenizers are not shared across threads).
"""

from __future__ import annotations

import threading

import apsw

__all__ = ["TOKENIZER", "stem", "stems", "tokens"]

TOKENIZER = ("porter", ["unicode61", "remove_diacritics", "2"])  # chunks_fts's tokenize option (index/schema.py)
_local = threading.local()


def tokens(text: str, *, query: bool = False) -> list[str]:
    """The tokens FTS5 makes of `text` (a lone surrogate is read as U+FFFD, as nothing can store it)."""
    tokenizer = getattr(_local, "tokenizer", None)
    if tokenizer is None:
        _local.conn = apsw.Connection(":memory:")
        tokenizer = _local.tokenizer = _local.conn.fts5_tokenizer(*TOKENIZER)
    flags = apsw.FTS5_TOKENIZE_QUERY if query else apsw.FTS5_TOKENIZE_DOCUMENT
    encoded = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()
    return list(tokenizer(encoded, flags, None, include_offsets=False, include_colocated=False))


def stem(word: str) -> str | None:
    """The one token the keyword index keeps for `word` (None: it makes none, or several)."""
    found = tokens(word, query=True)
    return found[0] if len(found) == 1 else None


def stems(words: list[str]) -> list[str | None]:
    """`stem` of each of `words` (single words of letters, as `text.spelling` makes them), in one call of the
    tokenizer: one call a word costs ~10 µs in calls alone, and a typo has ~450 candidates."""
    if not words or any(not word.isalpha() for word in words):
        return [stem(word) for word in words]
    if getattr(_local, "tokenizer", None) is None:
        tokens("")
    joined = " ".join(words)
    starts, at = [], 0
    for word in words:
        starts.append(at)
        at += len(word.encode()) + 1
    found = _local.tokenizer(joined.encode(), apsw.FTS5_TOKENIZE_QUERY, None, include_offsets=True,
                             include_colocated=False)
    if len(found) == len(words) and all(token[0] == start for token, start in zip(found, starts, strict=True)):
        return [token[2] for token in found]  # one token a word, each where its word begins
    # a word FTS5 splits or drops (a letter Python counts as one and FTS5 as a separator) has no one stem
    return [stem(word) for word in words]
