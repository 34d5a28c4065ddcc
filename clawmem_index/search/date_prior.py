"""A soft prior toward the days a query names: a third list, fused with the keyword and vector ones.

"What did we decide yesterday" names a day but no word a note of that day must hold, so the days
are not a filter and their words are not keywords (`text.dates`). Instead each chunk gets a
closeness to the days named: 1 inside them, halving every `half_life` days outside, 0 past
`window` days (and for undated chunks). The fused score becomes `(1 - w) x (what the keyword and
vector sides give) + w x closeness`, so a note of that day comes first unless another matches the
words far better, and a query that is only a date ("yesterday") lists that day's notes.

The chunks within the window are read as a list of their own (nearest the named days first, deeper
as the other lists are read deeper), so a note of that day is a candidate even when no word of the
query is in it. Closeness needs no read of the index, so a candidate from another list is scored on
it at once; a chunk on no list has a closeness of at most the last listed one's (0 when the window
was read whole), which is what the proof that the first k never depend on n (`candidates.gather`)
adds to its bound.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from clawmem_index.index.filters import ChunkFilter
from clawmem_index.text.dates import DateMention

__all__ = ["DatePrior"]


@dataclass(frozen=True)
class DatePrior:
    mentions: tuple[DateMention, ...]
    weight: float  # w above: the share of the fused score the closeness takes
    half_life: float  # days
    window: int  # days beyond the named ones past which closeness is 0

    _seen: dict[str, float] = field(default_factory=dict, compare=False, repr=False)  # by date: chunks share days

    def closeness(self, date: str | None) -> float:
        """1 within a named day or range, halving every `half_life` days outside, 0 past `window` (or undated)."""
        if date is None:
            return 0.0
        known = self._seen.get(date)
        if known is None:
            known = self._seen[date] = self._closeness(date)
        return known

    def _closeness(self, date: str) -> float:
        try:
            day = dt.date.fromisoformat(date[:10])
        except ValueError:
            return 0.0
        best = 0.0
        for mention in self.mentions:
            off = max((mention.first - day).days, (day - mention.last).days, 0)
            if off <= self.window:
                best = max(best, 0.5 ** (off / self.half_life))
        return best

    def windows(self, where: ChunkFilter) -> list[tuple[ChunkFilter, str, str]]:
        """Per mention: the filter of its window within `where`, and the days it names (first, last), which the
        window's chunks are read nearest to (none when `where` leaves nothing of the window)."""
        out: list[tuple[ChunkFilter, str, str]] = []
        for mention in self.mentions:
            since = (mention.first - dt.timedelta(days=self.window)).isoformat()
            before = (mention.last + dt.timedelta(days=self.window + 1)).isoformat()
            since = max(since, where.since) if where.since else since
            before = min(before, where.before) if where.before else before
            if since < before:
                out.append((ChunkFilter(where.path_prefix, where.source, since, before), mention.first.isoformat(),
                            mention.last.isoformat()))
        return out
