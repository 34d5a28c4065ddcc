"""Misspelled query words, read as the words the index holds one typo away.

A query word the index does not hold cannot match; when it was a typo ("adoptiom"), the question's
rarest and most telling word is lost and the answer is made of its common words. Such a word is given
the words one edit away (`clawmem_index.text.spelling`) whose stems the index holds, the most common
first, at most MAX_MEANT, unless it is a word of the language ("host", "hadn": a whole token of the
tokenizer's vocabulary), meant as typed though the index lacks it; they join the keyword query beside it
(the typo itself still matches nothing, so exact words keep every point they had).

The index is asked for its stems a two-letter block at a time (one range scan of its vocabulary,
kept until the index changes): the block the word begins with, and the few a typo in its second
letter leads to (a swap with the third, a dropped second letter, a neighbouring key). A block too
big to read whole (thousands of ids beginning "de") is read three letters at a time, and so on.
The rarer kinds are read once every word has had its ordinary reading, a kind at a time for all the
words, cheapest first, each candidate stem looked up by itself: the first key mistyped ("jdentity") or
one too many in front, a dropped second letter ("mntors"), a dropped first letter ("dentity", the
letters words most often begin with first). Blocks and lookups count against the query's MAX_BLOCKS and
MAX_LOOKUPS, so a word that is no typo cannot spend the reading of one after it, and no query reads
more than a bounded part of the vocabulary. FTS5 counts a block's chunks by walking each stem's matches,
so a block of common words costs ~10-35 ms at 100k chunks the first time after a write.

A typo is often one edit from several words ("fead": fear, read), and the most common is not the one
meant. When the query has other words, every kind of reading is looked up for every typo, and when some
typo has more than one, the chunks the other words find best are read once (CONTEXT_CHUNKS): the
readings those chunks hold come first, the most telling first (the share of a reading's chunks that are
among them), so "fead" beside "books" is read as "read" and "ove" beside "house" as "move", not "over".
A query of one word, or a typo none of whose readings is among those chunks, gets the likeliest kind of
typo that found any (an ordinary one before the first letter's), the most common reading first.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from clawmem_index.text.spelling import MIN_LETTERS, NEIGHBOURS, a_word_of_the_language, correctable, edits, letters_for
from clawmem_index.text.stemming import stem, stems

__all__ = ["CONTEXT_CHUNKS", "MAX_BLOCKS", "MAX_MEANT", "MAX_TYPOS", "Correction", "correct"]

MAX_MEANT = 2  # words a typo is read as, at most
# The chunks a query's other words find best, whose words tell a typo's readings apart ("fead" beside "books": read)
CONTEXT_CHUNKS = 30
# What one query's reading may cost, whatever its length: words looked for as typos (each stems ~500 one-edit
# candidates) and vocabulary blocks read (each a range scan of the index's vocabulary, a round trip on a shared
# index). A word past either budget is left as typed.
MAX_TYPOS = 4
MAX_BLOCKS = 64
# Stems looked up one by one (the vocabulary read from the stem itself: one seek, no block of neighbours) for the rarer
# kinds of typo, at most this many a query: ~0.03 ms each in SQLite, a round trip on a shared index.
MAX_LOOKUPS = 160
# The letters a dropped first letter is put back as, in the order English words most often begin with them (a word
# whose budget runs out part-way has tried the likeliest); letters of other alphabets the word holds come after.
_FIRST_LETTERS = "scpdmabtrfeihlgwounvkjqyzx"

@dataclass(frozen=True)
class Correction:
    """A query word the index does not hold, and the words (as typed, one edit away) it is read as."""

    word: str
    meant: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {"word": self.word, "read_as": list(self.meant)}


def correct(words: Sequence[str], vocabulary: Callable[[str], Mapping[str, int] | None],
            context: Callable[[Collection[str]], Sequence[AbstractSet[str]]] | None = None) -> list[Correction]:
    """The corrections of `words` (lower-case query words) against an index whose stems beginning with a
    prefix `vocabulary(prefix)` gives (stem -> chunks holding it; None when too many begin with it: a longer
    prefix is asked for then). Words the index holds are left alone. `context(typos)`: the stems of each of the
    chunks the query's other words find best (CONTEXT_CHUNKS at most; None: the query has no other words), asked
    once, when some typo has more than one reading; the readings found beside those words come first."""
    asked = {s for s in map(stem, words) if s}
    blocks = _Blocks(vocabulary)
    meant: dict[str, dict[str, _Candidate]] = {}  # word -> its stems held (ordinary typos first)
    for word in words:
        if len(meant) >= MAX_TYPOS or blocks.spent():
            break
        own = stem(word) if correctable(word) else None
        # A word of the language ("host", "fiends") is meant as typed, though the index lacks it
        if own is None or len(own) < 2 or word in meant or blocks.held(own) != 0 or a_word_of_the_language(word):
            continue
        meant[word] = _ordinary_typos(word, own, asked, blocks)
    _read_rarer(meant, asked, blocks, every_kind=context is not None)
    # The context is read only to choose: a word with a single reading is read as it whatever its neighbours
    chunks = context(list(meant)) if context is not None and any(len(held) > 1 for held in meant.values()) else ()
    found = []
    for word, held in meant.items():
        ranked = _by_context(held, chunks) or _by_kind(held)
        if ranked:
            found.append(Correction(word, tuple(held[s].candidate for s in ranked[:MAX_MEANT])))
    return found


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A stem one typo away that the index holds: in how many chunks, by which kind of typo (0: an ordinary one),
    how many letters it shares in front with the typed word, and the word as typed that makes it."""

    chunks: int
    kind: int
    shared: int
    candidate: str


def _read_rarer(meant: dict[str, dict[str, _Candidate]], asked: set[str], blocks: _Blocks, *,
                every_kind: bool) -> None:
    """Add the rarer kinds of typo to `meant`: for the words no ordinary typo explains, or (`every_kind`: the query
    has other words to tell the readings apart) for every word. Once every word has had its ordinary reading, and
    a kind at a time for all of them (a word that is no typo, looked for first, must not spend the budget of a
    typo after it); without `every_kind` a word stops at the first kind that finds it a reading."""
    rarer = {word: _rarer_typos(word) for word, best in meant.items() if every_kind or not best}
    for number, kind in enumerate(zip(*rarer.values(), strict=True), start=1):  # each word's first kind, ...
        for word, (candidates, shortest) in zip(rarer, kind, strict=True):
            best = meant[word]
            if best and not every_kind:
                continue
            for candidate, held_stem in zip(candidates, stems(candidates), strict=True):
                if not held_stem or len(held_stem) < shortest or held_stem in asked or held_stem in best:
                    continue
                chunks = blocks.looked_up(held_stem) or 0
                if chunks > 0:
                    best[held_stem] = _Candidate(chunks, number, 0, candidate)


def _by_context(held: Mapping[str, _Candidate], chunks: Sequence[AbstractSet[str]]) -> list[str]:
    """The stems of `held` found in the context's chunks, the most telling first: by the share of the chunks
    holding a stem that are in the context (so "over", in every chunk, does not outweigh "move", in the few the
    question is about), then the most common."""
    found = {s: sum(s in chunk for chunk in chunks) for s in held}
    return sorted((s for s, n in found.items() if n),
                  key=lambda s: (-found[s] / held[s].chunks, -held[s].chunks, held[s].candidate))


def _by_kind(held: Mapping[str, _Candidate]) -> list[str]:
    """The stems of `held` of the likeliest kind of typo that found any (ordinary ones first), the most common
    first."""
    if not held:
        return []
    kind = min(c.kind for c in held.values())
    return sorted((s for s, c in held.items() if c.kind == kind),
                  key=lambda s: (-held[s].chunks, held[s].candidate))


class _Blocks:
    """The blocks of the vocabulary one query reads (each once), at most MAX_BLOCKS."""

    def __init__(self, vocabulary: Callable[[str], Mapping[str, int] | None]) -> None:
        self._vocabulary = vocabulary
        self._read: dict[str, Mapping[str, int] | None] = {}
        self._looked: dict[str, int | None] = {}

    def spent(self) -> bool:
        return len(self._read) >= MAX_BLOCKS

    def held(self, term: str, shortest: int = 2) -> int | None:
        """How many chunks hold `term`, from the shortest block of the vocabulary small enough to read; None when
        the query's MAX_BLOCKS are spent before it could be told."""
        for length in range(shortest, len(term) + 1):
            prefix = term[:length]
            if prefix not in self._read:
                if self.spent():
                    return None
                self._read[prefix] = self._vocabulary(prefix)
            block = self._read[prefix]
            if block is not None:
                return block.get(term, 0)
        return 0

    def looked_up(self, term: str) -> int | None:
        """How many chunks hold `term`, asked of the vocabulary by the whole stem (the stems that begin with it: a
        few at most); None when the query's MAX_LOOKUPS are spent."""
        if term not in self._looked:
            if len(self._looked) >= MAX_LOOKUPS:
                return None
            found = self._vocabulary(term)
            self._looked[term] = None if found is None else found.get(term, 0)
        return self._looked[term]


def _ordinary_typos(word: str, own: str, asked: set[str], blocks: _Blocks) -> dict[str, _Candidate]:
    """The stems one ordinary typo away from `word` (stem `own`) that the index holds, each as the word as typed
    nearest the typed one's start."""
    near = _blocks(own)
    best: dict[str, _Candidate] = {}
    candidates = edits(word)
    for candidate, meant in zip(candidates, stems(candidates), strict=True):
        if meant is None or meant in asked or meant[:2] not in near:
            continue
        chunks = blocks.held(meant) or 0
        shared = _shared_start(word, candidate)
        if chunks > 0 and (meant not in best or shared > best[meant].shared):
            best[meant] = _Candidate(chunks, 0, shared, candidate)
    return best


def _rarer_typos(word: str) -> list[tuple[list[str], int]]:
    """The words `word` may have been meant as when no ordinary typo is near, each kind with the length of the blocks
    it is read in, tried in turn until one is held: its second letter dropped ("mntors"), its first key mistyped
    ("jdentity") or one too many in front (the blocks of the keys beside it), its first letter dropped ("dentity";
    put back as the likeliest first letters first, so a spent budget has tried them)."""
    first, rest = word[0], word[1:]
    typed = [key + rest for key in NEIGHBOURS.get(first, "")] + ([rest] if len(rest) >= MIN_LETTERS else [])
    others = "".join(c for c in letters_for(word) if c not in _FIRST_LETTERS)
    return [(typed, 2), ([first + c + rest for c in letters_for(word)], 3),
            ([c + word for c in _FIRST_LETTERS + others], 3)]


def _blocks(own: str) -> set[str]:
    """The two-letter beginnings of the stems a word whose stem is `own` may have been meant as (one typo, not in
    its first letter, or its first two letters swapped); read from the stem, as the index keeps its letters."""
    first, second = own[0], own[1]
    return {first + second, first + own[2:3], second + first} | {first + key for key in NEIGHBOURS.get(second, "")}


def _shared_start(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
