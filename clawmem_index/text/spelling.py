"""Words one typo away: what a misspelled query word may have been meant as.

The index keeps stems ("adoption" is kept as "adopt"), and a typo near a word's end breaks the
stemmer's suffix rules ("adoptiom" stems to itself), so a distance between the typed word's stem
and the index's stems misses most typos. Instead the words one typo away from the word as typed are
generated here and the index is asked which of them it holds, stem by stem (~300 words for an
8-letter word; `clawmem_index.search.typo_reading` decides which to add). What the index holds is the
index's own vocabulary (FTS5's `fts5vocab`, the shared index's `cm_terms`), so nothing here is kept
and nothing can go stale.

A typo, as people make them: a letter dropped (any letter may be put back), one too many (taken
out), two neighbours swapped, or a key next to the right one (on a QWERTY keyboard; a letter not on
it may be changed into any of the word's own letters). Changing a letter into any other would read
a word the index lacks as a real but different word ("grandma" as "grandpa", "hide" as "hike").
Letters tried for a dropped one: English's 26 and the word's own (so "zürich" and a Cyrillic
word's own letters are in reach); other alphabets can be added by language.
"""

from __future__ import annotations

import string

__all__ = ["MIN_LETTERS", "NEIGHBOURS", "a_word_of_the_language", "correctable", "edits", "letters_for"]

MIN_LETTERS = 3  # shorter: too many words one edit away; a real one ("cat") is never read (a_word_of_the_language)
MAX_LETTERS = 32  # longer "words" are ids or pasted runs, not typed words
_LETTERS = frozenset(string.ascii_lowercase)

# The keys around each key of a QWERTY keyboard (same row, and the rows above and below).
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
NEIGHBOURS: dict[str, str] = {}
for _r, _row in enumerate(_ROWS):
    for _i, _key in enumerate(_row):
        _near = {_row[j] for j in (_i - 1, _i + 1) if 0 <= j < len(_row)}
        for _other in (_r - 1, _r + 1):
            if 0 <= _other < len(_ROWS):
                _near |= {_ROWS[_other][j] for j in (_i - 1, _i, _i + 1) if 0 <= j < len(_ROWS[_other])}
        NEIGHBOURS[_key] = "".join(sorted(_near))


def correctable(word: str) -> bool:
    """Whether a query word may be a typo worth correcting: letters only (no digits: an id, a number or a
    date is typed as meant, or copied), long enough that one edit rarely lands on another real word."""
    return MIN_LETTERS <= len(word) <= MAX_LETTERS and word.isalpha()


def a_word_of_the_language(word: str) -> bool:
    """Whether `word` (lower case) is one the language makes, though the index may not hold it ("host", "father",
    "hadn"): a whole token of cl100k_base after a space. That vocabulary was learned from a vast body of text, so
    a word of it is written often; a typo ("jdentity", "ession", "stagng") is cut into pieces (on LoCoMo's
    questions, 18 of 18 real words the index lacked and 1 of 40 typos, itself a word: "lowers"). Loading the
    tokenizer costs a process that has not yet ~0.07 s, paid only by a query with a word the index lacks."""
    from clawmem_index.text.tokens import get_encoding

    return len(get_encoding("cl100k_base").encode_ordinary(" " + word)) == 1


def edits(word: str) -> list[str]:
    """Every distinct word `word` (lower case) may have been meant as, one typo away, itself left out, in a fixed
    order."""
    word = word.lower()
    letters = letters_for(word)
    own = "".join(sorted(set(word)))
    found: dict[str, None] = {}
    for i in range(len(word) + 1):
        left, right = word[:i], word[i:]
        if right:
            found[left + right[1:]] = None  # a letter too many
            for c in NEIGHBOURS.get(right[0], own):
                found[left + c + right[1:]] = None  # the key beside the right one
        if len(right) > 1:
            found[left + right[1] + right[0] + right[2:]] = None  # two swapped
        for c in letters:
            found[left + c + right] = None  # a letter dropped
    found.pop(word, None)
    return list(found)


def letters_for(word: str) -> list[str]:
    """The letters a dropped one may have been: English's 26 and the word's own."""
    return sorted(_LETTERS | set(word.lower()))
