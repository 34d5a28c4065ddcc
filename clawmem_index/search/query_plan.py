"""How a query is read before it is ranked: the days it names, its keywords, the words its typos were meant as.

A typo can hide a date ("camping in kune", "on kctober 13"): once its typos are read, a query is read for dates
again as meant, and a date found only then is read as the clean query's would be (its words out of the keywords).

Each stage says what it did (`QueryPlan.as_dict`): the answer carries it as `query`, so an agent or
a person sees that "adoptiom" was also read as "adoption", and `--explain` prints it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from clawmem_index.search.typo_reading import Correction, correct
from clawmem_index.text.dates import DateMention, find_dates, may_name_a_date, without_dates
from clawmem_index.text.keywords import match_of, query_terms, quoted_spans

__all__ = ["MAX_DATES", "QueryPlan", "plan_query"]

MAX_DATES = 4  # ranges of days a query's prior pulls toward (a query of 500 "yesterday"s reads one window)
# The first part of a contraction ("hadn't", "they'll", "I'd"): a word the language makes, not a typo, though the
# index may not hold it ("hadn" is not "had" or "hand"). A possessive ("Carolne's") is a word and may be one.
_CONTRACTED = re.compile(r"(\w+)['\u2019](?:t|ll|re|ve|d|m)\b", re.IGNORECASE)


@dataclass(frozen=True)
class QueryPlan:
    match: str | None  # the keyword side's FTS5 expression (None: no word to match)
    words: str  # the query without the words of its dates (what the keyword side and its fallback read; as meant
    # when a typo hid a date)
    corrections: tuple[Correction, ...] = ()
    dates: tuple[DateMention, ...] = ()

    def as_meant(self, query: str) -> str:
        """`query` with each typo replaced by its likeliest reading: what the vector side embeds, as a model reads
        "which books did she read" nearer the note than "fead" (LoCoMo, one typo in the first letter: hybrid
        recall@6 +0.5 points over embedding the query as typed)."""
        return _as_meant(query, self.corrections)

    def as_dict(self) -> dict[str, object]:
        """What the answer says of how the query was read (empty: as typed)."""
        data: dict[str, object] = {}
        if self.dates:
            data["dates"] = [m.as_dict() for m in self.dates]
        if self.corrections:
            data["corrected"] = [c.as_dict() for c in self.corrections]
        return data


def plan_query(query: str, vocabulary: Callable[[str], Mapping[str, int] | None] | None,
               today: dt.date | None = None, dated: Callable[[DateMention], bool] | None = None,
               found_by: Callable[[list[str]], Sequence[AbstractSet[str]]] | None = None) -> QueryPlan:
    """`vocabulary`: the index's stems by prefix (`IndexStore.keywords.vocabulary`), None to read no typo; `today`: the
    day relative dates count from, None to read no date (its words are then keywords); `dated`: whether the
    index has a note near a date (one it has nothing near is left as words: "moved here 4 years ago");
    `found_by(words)`: the stems of each of the chunks `words` find best, the context a typo is read in."""
    asked: dict[tuple[dt.date, dt.date], bool] = {}  # each range of days asked of the index once
    dates, words = _dates_of(query, today, dated, asked)
    terms = query_terms(words)
    quoted = quoted_spans(query)
    # Taken as typed: words in quotes, contractions' first parts, and words with a capital past their first letter
    # (ids, acronyms, gene names: "DLNs", "PPARy", "RUNX" are not typos of "dls", "ppar", "run"; "Carolne" may be one)
    as_typed = {t for a, b in quoted for t in query_terms(query[a:b].strip("\"\u201c\u201d"))} | \
        {w.lower() for w in re.findall(r"\w+", query) if any(c.isupper() for c in w[1:])} | \
        {m.group(1).lower() for m in _CONTRACTED.finditer(query)}

    def context(typos: Collection[str]) -> Sequence[AbstractSet[str]]:
        """The chunks the words that are no typo find (none when every word is one: nothing to read them by)."""
        others = [t for t in terms if t not in typos]
        return found_by(others) if found_by is not None and others else ()

    corrections = tuple(correct([t for t in terms if t not in as_typed], vocabulary,
                                context if found_by is not None and len(set(terms)) > 1 else None)) \
        if vocabulary is not None else ()
    if corrections:
        meant = {c.word: c.meant for c in corrections}
        if today is not None and any(may_name_a_date(c.meant[0]) for c in corrections):  # a typo may hide a date
            redated, rewords = _dates_of(_as_meant(query, corrections), today, dated, asked)
            if {(m.first, m.last) for m in redated} - {(m.first, m.last) for m in dates}:  # it did
                dates, words = redated, rewords
                terms = query_terms(words)  # each typo as its likeliest reading, its other readings beside it
                meant = {c.meant[0].lower(): c.meant[1:] for c in corrections}
        terms = [t for term in terms for t in (term, *meant.get(term, ()))]
    return QueryPlan(match_of(terms), words, corrections, dates)


def _as_meant(query: str, corrections: Sequence[Correction]) -> str:
    """`query` with each corrected word replaced by its likeliest reading."""
    meant = {c.word: c.meant[0] for c in corrections}
    return re.sub(r"\w+", lambda m: meant.get(m.group().lower(), m.group()), query) if meant else query


def _dates_of(query: str, today: dt.date | None, dated: Callable[[DateMention], bool] | None,
              asked: dict[tuple[dt.date, dt.date], bool]) -> tuple[tuple[DateMention, ...], str]:
    """The ranges of days `query` names outside quotes (each once, at most MAX_DATES; one the index has no note near,
    by `dated`, is left as words: `asked` keeps the answers), and the query without their words."""
    if today is None:
        return (), query
    quoted = quoted_spans(query)
    found = [m for m in find_dates(query, today) if not any(a <= m.span[0] < b for a, b in quoted)]
    days: dict[tuple[dt.date, dt.date], DateMention] = {}
    for mention in found:
        key = (mention.first, mention.last)
        if key in days or len(days) >= MAX_DATES:
            continue
        if key not in asked:
            asked[key] = dated is None or dated(mention)
        if asked[key]:
            days[key] = mention
    dates = tuple(days.values())
    return dates, without_dates(query, [m for m in found if (m.first, m.last) in days]) if dates else query
