"""Text as the FTS5 index sees it, and FTS5 queries built from anything a user types.

FTS5's `unicode61` tokenizer keeps a run of Chinese or Japanese characters as one token, so a word
inside a sentence could never match. Before indexing and querying, every CJK character is set
apart by spaces; a CJK query becomes phrases of adjacent character pairs, which match the same
pairs in the text. English keeps the `porter` word tokenizer (better BM25 than trigrams).

The query builder only ever emits double-quoted terms joined by OR, so no input can raise an FTS5
syntax error, and a question matching only some of its words still finds (and ranks) documents.
Words the user put in quotes ("staging server", “like this”) are one term, a phrase: FTS5 matches
them only next to each other, in that order.
"""

from __future__ import annotations

import re

__all__ = ["build_match", "build_prefix_match", "index_text", "match_of", "query_terms", "quoted_spans"]

_CJK = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # han
    "\uac00-\ud7af"  # hangul syllables
    "\U00020000-\U0002ebef"  # han extensions
)
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(rf"[^\W_{_CJK}]+", re.UNICODE)

MAX_TERMS = 64

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between both
    but by can could did do does doing down during each few for from further had has have having he her here hers
    herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off on
    once only or other our ours ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves""".split()
)


def index_text(text: str) -> str:
    """The text handed to FTS5: CJK characters spaced apart, everything else untouched."""
    if not _CJK_RUN.search(text):
        return text
    return _CJK_RUN.sub(lambda m: " " + " ".join(m.group()) + " ", text)


_QUOTED = re.compile(r'"([^"]*)"|\u201c([^\u201c\u201d]*)\u201d')  # "straight" or “curly” quotes


def query_terms(query: str) -> list[str]:
    """The FTS5 terms for a user query: its quoted phrases, its words (stop-words dropped when others remain)
    and CJK pairs."""
    phrases: list[str] = []
    for quoted in _QUOTED.finditer(query):
        words = [w.lower() for w in _WORD.findall(quoted.group(1) or quoted.group(2) or "")]
        if len(words) > 1 and not _CJK_RUN.search(quoted.group()):
            phrases.append(" ".join(words))
            query = query[:quoted.start()] + " " * (quoted.end() - quoted.start()) + query[quoted.end():]
    terms = _word_terms(query, keep_stopwords=not phrases)
    seen = dict.fromkeys(phrases + terms)
    return list(seen)[:MAX_TERMS]


def quoted_spans(query: str) -> list[tuple[int, int]]:
    """Where the query has words in quotes (taken as typed: no date or typo is read inside them)."""
    return [m.span() for m in _QUOTED.finditer(query)]


def _word_terms(query: str, *, keep_stopwords: bool = True) -> list[str]:
    """The words and CJK pairs; stop-words only when nothing else is left (and `keep_stopwords`)."""
    words: list[str] = []
    cjk: list[str] = []
    for match in re.finditer(f"{_CJK_RUN.pattern}|{_WORD.pattern}", query):
        piece = match.group()
        if _CJK_RUN.fullmatch(piece):
            if len(piece) == 1:
                cjk.append(piece)
            else:
                cjk.extend(f"{a} {b}" for a, b in zip(piece, piece[1:], strict=False))
        else:
            words.append(piece.lower())
    content = [w for w in words if w not in STOPWORDS]
    chosen = (content or (words if keep_stopwords else [])) + cjk
    seen: dict[str, None] = {}
    for term in chosen:
        seen.setdefault(term, None)
    return list(seen)[:MAX_TERMS]


def build_match(query: str) -> str | None:
    """An FTS5 MATCH expression that can not fail to parse, or None when the query has no searchable term."""
    return match_of(query_terms(query))


def match_of(terms: list[str]) -> str | None:
    """The FTS5 MATCH expression (an OR of quoted terms) of `query_terms`, or of terms added to them."""
    if not terms:
        return None
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


PREFIX_SHARE = 0.6  # of a word's letters kept as its prefix: "stagng" -> stag*, "a828e60" -> a828*
MIN_PREFIX = 3


def build_prefix_match(query: str) -> str | None:
    """An FTS5 expression matching the beginnings of the query's words (None: no word long enough).

    The fallback when nothing matches the words as typed: a typo past the first letters, or the
    start of an identifier, still finds the chunks holding the word it begins.
    """
    prefixes: dict[str, None] = {}
    for term in query_terms(query):
        if " " in term or len(term) < MIN_PREFIX:
            continue  # CJK pairs are matched as typed
        keep = max(MIN_PREFIX, -(-len(term) * 6 // 10))
        prefixes.setdefault(term[:keep], None)
    if not prefixes:
        return None
    return " OR ".join('"' + prefix.replace('"', '""') + '"*' for prefix in prefixes)
