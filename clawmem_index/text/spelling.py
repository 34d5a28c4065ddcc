"""Words one typo away: what a misspelled query word may have been meant as.

The index keeps stems ("adoption" is kept as "adopt"), and a typo near a word's end breaks the
stemmer's suffix rules ("adoptiom" stems to itself), so a distance between the typed word's stem
and the index's stems misses most typos. Instead every word one edit away from the word as typed
(a letter dropped, added, changed, or two neighbours swapped: Damerau's four) is generated here
and the index is asked which of them it holds, stem by stem (about 450 words for an 8-letter
word; `clawmem_index.search.spelling` decides which to add). What the index holds is the index's
own vocabulary (FTS5's `fts5vocab`, the shared index's `cm_terms`), so nothing here is kept and
nothing can go stale.

Letters tried for an insert or a change: English's 26 and the word's own (so "zurich" and "zürich"
and a Cyrillic word's own letters are in reach); other alphabets can be added by language.
"""

from __future__ import annotations

import string

__all__ = ["MIN_LETTERS", "correctable", "edits"]

MIN_LETTERS = 5  # shorter words have too many real words one edit away ("bake": cake, bike, lake, make...)
MAX_LETTERS = 32  # longer "words" are ids or pasted runs, not typed words
_LETTERS = frozenset(string.ascii_lowercase)


def correctable(word: str) -> bool:
    """Whether a query word may be a typo worth correcting: letters only (no digits: an id, a number or a
    date is typed as meant, or copied), long enough that one edit rarely lands on another real word."""
    return MIN_LETTERS <= len(word) <= MAX_LETTERS and word.isalpha()


def edits(word: str) -> list[str]:
    """Every distinct word one edit from `word` (lower case), `word` itself left out, in a fixed order."""
    word = word.lower()
    letters = sorted(_LETTERS | set(word))
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    found: dict[str, None] = {}
    for left, right in splits:
        if right:
            found[left + right[1:]] = None  # dropped
        if len(right) > 1:
            found[left + right[1] + right[0] + right[2:]] = None  # swapped
        for c in letters:
            if right:
                found[left + c + right[1:]] = None  # changed
            found[left + c + right] = None  # added
    found.pop(word, None)
    return list(found)
