"""The keyword index: FTS5 rows beside the chunks, ranked by BM25.

`chunks_fts` is contentless (the text is stored once, in `chunks`) with contentless_delete, so a
row is removed by rowid; its rowid is the chunk's `seq`. The caller's transaction covers the chunk
row and its FTS row together.

Ranking an OR of common words, FTS5 scores every chunk holding any of them (about half a
microsecond each, plus a scan of every word's doclist for its IDF) before it keeps the best few.
FTS5's BM25 of an OR of phrases is, bit for bit, the sum in phrase order of what each phrase
scores on its own (a missing phrase adds exactly 0.0), so each phrase's scores are read once per
state of the keyword index and kept (`PostingsCache`, by token: "cells" and "cell" are one list; a
daemon's query threads share one); a query then adds them up with numpy and picks the top `limit`,
the same rows, scores and order FTS5 would give. A single word's scores are computed from bulk reads of
FTS5's own statistics (clawmem_index.index.bm25, ~5x cheaper than reading `bm25()` row by row); other
phrases are read from FTS5. Queries matching few chunks, other expressions, and searches inside a
transaction go to FTS5 as before.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import apsw

from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.rows import TextHit
from clawmem_index.index.vocabulary import FtsVocabulary

__all__ = ["KeywordIndex", "PostingsCache", "TextHit"]

_OR_OF_PHRASES = re.compile(r'"(?:[^"]|"")+"\*?(?: OR "(?:[^"]|"")+"\*?)*')
_PHRASE = re.compile(r'"(?:[^"]|"")+"\*?')

PLAIN_MAX = 2048  # matches (summed over the phrases) below which FTS5 ranks the query itself, as fast
CACHE_POSTINGS = 1 << 20  # per-phrase scores a connection keeps on its own (16 bytes each), least recently used dropped
SHARED_POSTINGS = 1 << 22  # those the connections of a long-lived process keep together (64 MB)
ASKED_WINDOW = 1 << 12  # look-ups after which the counts of how often each list was asked for are halved
FILTER_DEPTH = 1 << 16  # how deep the best matches are walked for a filter before FTS5 ranks the query instead
COUNTS_KEPT = 1 << 16  # phrases whose match counts are kept per connection until the index changes
ASKED_AT_ONCE = 16  # rows whose scores are asked one by one at most; more, of few matches: all matches read
CHECKED = 3  # hits FTS5 scores after each change of its records to confirm the sums (each rescans the phrases)

if TYPE_CHECKING:  # numpy is imported where the sums are made: a command that never sums does not load it
    import numpy as np
    import numpy.typing as npt

    from clawmem_index.index.bm25 import SharedCounts, TermScorer

    Ints = npt.NDArray[np.int64]
    Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _Postings:
    """One phrase's matches: rowids ascending, and the BM25 relevance (-bm25) the phrase alone gives each."""

    seqs: Ints
    gains: Floats


class PostingsCache:
    """Phrases' scores (`_Postings`) for one state of the keyword index, least recently used dropped
    past `budget` postings (None: CACHE_POSTINGS), but only for a list asked for more often than each
    list it would push out (recent look-ups counted, halved every ASKED_WINDOW).

    Least recently used alone keeps nothing of a round of queries whose lists add up to more than the
    budget: each list pushes out the one needed next (1M chunks, the 300 SciFact questions' 7.3M postings
    against 4M kept: 22k postings read a query at the median; 13k with the counts).

    A phrase's scores depend on nothing but FTS5's rows, so any connection that sees the same state
    (the file's `created_at`, FTS5's totals and segment records) may use the scores another read: one
    cache serves all of a daemon's query threads, and survives commits that leave the keyword index as
    it was (a batch of vectors). A state other than the held one's misses; storing for it drops the rest.
    The costliest lists are the commonest words', which nearly every query holds, so a few dozen lists
    spare most of the reading (1M chunks, 300 queries: 134k postings read a query without them, 27k
    with 64 MB kept).
    """

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._state: Hashable = None
        self._entries: OrderedDict[Hashable, _Postings] = OrderedDict()
        self._held = 0
        self._counts: SharedCounts | None = None
        self._asked: Counter[Hashable] = Counter()
        self._lookups = 0

    def token_counts(self) -> SharedCounts:
        """The rows' token counts (clawmem_index.index.bm25) the connections sharing this cache share too."""
        with self._lock:
            if self._counts is None:
                from clawmem_index.index.bm25 import SharedCounts

                self._counts = SharedCounts()
            return self._counts

    def get(self, state: Hashable, key: Hashable) -> _Postings | None:
        with self._lock:
            self._asked[key] += 1
            self._lookups += 1
            if self._lookups % ASKED_WINDOW == 0:
                self._asked = Counter({k: n // 2 for k, n in self._asked.items() if n > 1})
            if state != self._state:
                return None
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, state: Hashable, key: Hashable, postings: _Postings) -> None:
        budget = CACHE_POSTINGS if self.budget is None else self.budget
        with self._lock:
            if state != self._state:
                self._entries.clear()
                self._state, self._held = state, 0
            if key in self._entries:
                return
            over = self._held + len(postings.seqs) - budget
            if over > 0:
                pushed_out = []
                for held, kept in self._entries.items():  # least recently used first
                    if over <= 0:
                        break
                    pushed_out.append(held)
                    over -= len(kept.seqs)
                if any(self._asked[held] >= self._asked[key] for held in pushed_out):
                    return
            self._entries[key] = postings
            self._held += len(postings.seqs)
            while self._held > budget and len(self._entries) > 1:
                _, dropped = self._entries.popitem(last=False)
                self._held -= len(dropped.seqs)

    @property
    def held(self) -> int:
        """Postings held (each a seq and a score: 16 bytes)."""
        return self._held


class KeywordIndex:
    """chunks_fts on one connection."""

    def __init__(self, conn: apsw.Connection, *, keep_scores: bool = True,
                 postings: PostingsCache | None = None) -> None:
        """`keep_scores`: sum kept per-phrase scores for common words (a long-lived process); else FTS5 ranks.
        `postings`: where they are kept (shared with other connections to the same file; else its own)."""
        self._conn = conn
        self._keep_scores = keep_scores
        self._version: tuple[int, int] | None = None
        self._state: Hashable = None  # the keyword index's state in this version (the postings' key)
        self._postings = postings if postings is not None else PostingsCache()
        self._counts: dict[str, int] = {}
        self._ranked: tuple[str, Ints, Floats] | None = None
        # The last expression's lists, whether the shared cache kept them or not: its candidates' scores
        # are asked for next (`scores_of`), and a list not kept would be read twice.
        self._lately: tuple[Hashable, dict[Hashable, _Postings]] = (None, {})
        self._sums_checked = False  # whether FTS5 has confirmed a summed ranking of this state of its records
        self._checked_records: list[tuple[int, bytes]] | None = None  # FTS5's totals and structure, as checked
        self._sums_exact = True
        self._scorer: TermScorer | None = None  # made at the first list read; None after, if it cannot be
        self._scorer_tried = False
        self._scorer_fresh: bool | None = None  # whether it could read this version's counts (None: not yet)
        self._vocabulary = FtsVocabulary(conn)

    def add(self, seq: int, text: str, *, id: str, path: str, source: str, model: str, start_line: int,
            end_line: int) -> None:
        self._conn.execute(
            "INSERT INTO chunks_fts(rowid, text, id, path, source, model, start_line, end_line)"
            " VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, text, id, path, source, model, start_line, end_line),
        )

    def move(self, seq: int, start_line: int, end_line: int) -> None:
        self._conn.execute("UPDATE chunks_fts SET start_line = ?, end_line = ? WHERE rowid = ?",
                           (start_line, end_line, seq))

    def remove(self, seq: int) -> None:
        self._conn.execute("DELETE FROM chunks_fts WHERE rowid = ?", (seq,))

    def vocabulary(self, prefix: str) -> dict[str, int] | None:
        """The stems chunks_fts holds that begin with `prefix`, with how many chunks hold each (vocabulary)."""
        return self._vocabulary.stems(prefix)

    def search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        """The best `limit` chunks for an FTS5 MATCH expression, best first (bm25 ascending: FTS5 ranks
        are negative; ties by seq)."""
        phrases = self._phrases(match)
        if phrases is None or limit <= 0:
            return self._fts_search(match, limit, where)
        with self._snapshot():
            if not self._common(phrases):
                return self._fts_search(match, limit, where)
            seqs, gains = self._ranking(match, phrases)
            best = self._best(seqs, gains, limit, where)
            if best is None or not self._confirmed(match, seqs[best], gains[best]):
                return self._fts_search(match, limit, where)
            return self._hits(seqs[best], gains[best])

    def ranking(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the best `limit` matches, best first (ties by seq): `search` without the chunks' rows.

        Reading deeper costs almost nothing more (FTS5 scores every match to sort them; the summed
        scores are sorted once per query), so a search reads its keyword side once, deep, and fetches
        the rows (`TextHit`s, through the store) only for the chunks it keeps.
        """
        phrases = self._phrases(match)
        if phrases is not None and limit > 0:
            with self._snapshot():
                if self._common(phrases):
                    seqs, gains = self._ranking(match, phrases)
                    best = self._best(seqs, gains, limit, where)
                    if best is not None and self._confirmed(match, seqs[best], gains[best]):
                        return [(seq, -gain) for seq, gain in zip(seqs[best].tolist(), gains[best].tolist(),
                                                                   strict=True)]
        return self._fts_ranking(match, limit, where)

    def scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        """The BM25 score `search` would give each of `seqs` (absent: it does not match).

        FTS5's BM25 takes its statistics from the whole table, so a score asked for one row is the
        one that row gets in any search.
        """
        import numpy as np

        wanted = list(seqs)
        phrases = self._phrases(match)
        if phrases is None or not wanted:
            return self._fts_scores_of(match, wanted)
        with self._snapshot():
            if not self._common(phrases):
                return self._fts_scores_of(match, wanted)
            asked = np.array(wanted, dtype=np.int64)
            total = np.zeros(len(asked))
            found = np.zeros(len(asked), dtype=bool)
            for postings in [self._phrase_postings(p) for p in phrases]:
                if not len(postings.seqs):
                    continue
                at = np.minimum(np.searchsorted(postings.seqs, asked), len(postings.seqs) - 1)
                hit = postings.seqs[at] == asked
                total[hit] += postings.gains[at[hit]]
                found |= hit
            return {int(seq): -float(gain) for seq, gain, hit in zip(asked, total, found, strict=True) if hit}

    # -- FTS5 ranks the query itself ------------------------------------------------------------

    def _fts_search(self, match: str, limit: int, where: ChunkFilter | None) -> list[TextHit]:
        return self.hits(self._fts_ranking(match, limit, where))

    def _fts_ranking(self, match: str, limit: int, where: ChunkFilter | None) -> list[tuple[int, float]]:
        join, condition, args = "", "1", {"match": match, "k": limit}
        if where:
            join = " JOIN chunks AS w ON w.seq = chunks_fts.rowid"
            condition, extra = where.sql("w")
            args.update(extra)
        sql = (f"SELECT chunks_fts.rowid, bm25(chunks_fts) AS score FROM chunks_fts{join}"
               f" WHERE chunks_fts MATCH :match AND {condition} ORDER BY score, chunks_fts.rowid LIMIT :k")
        return [(int(seq), float(score)) for seq, score in self._conn.execute(sql, args)]

    def _fts_scores_of(self, match: str, seqs: list[int]) -> dict[int, float]:
        """A rowid constraint makes FTS5 seek, not scan the matches (it still scans each phrase for its IDF: ~50 µs a
        row); for many rows of an expression matching few chunks, all its matches are read at once instead."""
        if len(seqs) > ASKED_AT_ONCE and int(self._conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM chunks_fts WHERE chunks_fts MATCH ? LIMIT ?)",
                (match, PLAIN_MAX + 1)).get) <= PLAIN_MAX:
            wanted = set(seqs)
            return {int(seq): float(score) for seq, score in self._conn.execute(
                "SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ?", (match,)) if seq in wanted}
        sql = "SELECT bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid = ?"
        scores: dict[int, float] = {}
        for seq in seqs:
            row = self._conn.execute(sql, (match, seq)).fetchone()
            if row is not None:
                scores[seq] = float(row[0])
        return scores

    # -- per-phrase scores, summed --------------------------------------------------------------

    def _phrases(self, match: str) -> list[str] | None:
        """The phrases of an OR of quoted phrases (what keywords.build_match makes); None for anything else,
        or inside a transaction, whose changes the kept scores could outlive if it is rolled back."""
        if not (self._keep_scores and self._sums_exact) or not _OR_OF_PHRASES.fullmatch(match) \
                or not self._conn.get_autocommit():
            return None
        return _PHRASE.findall(match)

    def _confirmed(self, match: str, seqs: Ints, gains: Floats) -> bool:
        """Once per state of FTS5's records, whether it scores the first summed answer the same (3 rows).

        The sums (and the scores bm25.TermScorer computes) equal FTS5's only if its SQLite build rounds
        each operation as numpy does (a compiler fusing a multiply-add, as on some ARM builds, would
        not), and only as long as FTS5 keeps its statistics as bm25.py reads them: if not, FTS5 ranks
        from then on. Checked again after each change of the keyword index (its totals and segments, not a
        commit of vectors): at 1M chunks the next query costs 9 ms more (p50; p95 30 ms).
        """
        if self._sums_checked or not len(seqs):
            return True
        sql = "SELECT bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid = ?"
        checked = zip(seqs[:CHECKED].tolist(), (-gains[:CHECKED]).tolist(), strict=True)
        self._sums_exact = all(self._conn.execute(sql, (match, seq)).fetchone() == (bm25,) for seq, bm25 in checked)
        self._sums_checked = True
        return self._sums_exact

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction, so every phrase is read from the same version of the index; the kept
        scores are dropped when that version is not the one they were read from."""
        self._conn.execute("BEGIN")
        try:
            version = (int(self._conn.execute("PRAGMA data_version").get), self._conn.total_changes())
            if version != self._version:
                self._counts.clear()
                self._ranked, self._version = None, version
                self._scorer_fresh = None
                records = cast("list[tuple[int, bytes]]", self._conn.execute(
                    "SELECT id, block FROM chunks_fts_data WHERE id IN (1, 10)").fetchall())
                if records != self._checked_records:  # FTS5's totals or segments changed: confirm again
                    self._sums_checked, self._checked_records = False, records
                file = self._conn.execute("SELECT value FROM meta WHERE key = 'created_at'").fetchone()
                self._state = (file, tuple((int(i), bytes(block)) for i, block in records))
            yield
        finally:
            self._conn.execute("COMMIT")

    def _common(self, phrases: list[str]) -> bool:
        """Whether the phrases match enough chunks for summing kept scores to beat FTS5's own ranking.

        Matches are counted up to PLAIN_MAX + 1 a phrase (counting all of a common word's costs ~33 ns a match)."""
        total = 0
        for phrase in dict.fromkeys(phrases):
            kept = self._postings.get(self._state, self._key(phrase))
            if kept is not None:
                total += len(kept.seqs)
            else:
                count = self._counts.get(phrase)
                if count is None:
                    if len(self._counts) >= COUNTS_KEPT:  # a daemon no write reaches for days: stay bounded
                        self._counts.clear()
                    count = self._counts[phrase] = int(self._conn.execute(
                        "SELECT count(*) FROM (SELECT 1 FROM chunks_fts WHERE chunks_fts MATCH ? LIMIT ?)",
                        (phrase, PLAIN_MAX + 1)).get)
                total += count
            if total > PLAIN_MAX:
                return True
        return False

    def _key(self, phrase: str) -> Hashable:
        """What a phrase's scores are kept under: its token when it is one (words with one stem share it)."""
        scorer = self._term_scorer(fresh=False)
        token = scorer.term(phrase) if scorer is not None else None
        return phrase if token is None else ("token", token)

    def _phrase_postings(self, phrase: str) -> _Postings:
        import numpy as np

        key = self._key(phrase)
        kept = self._lately[1].get(key) if self._lately[0] == self._state else None
        if kept is None:
            kept = self._postings.get(self._state, key)
        if kept is not None:
            return kept
        scorer = self._term_scorer()
        if scorer is not None and isinstance(key, tuple):
            postings = _Postings(*scorer.gains(key[1]))
        else:
            rows = self._conn.execute("SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ?"
                                      " ORDER BY rowid", (phrase,)).fetchall()
            postings = _Postings(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                                 -np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows)))
        postings.seqs.flags.writeable = postings.gains.flags.writeable = False  # shared by threads
        self._postings.put(self._state, key, postings)
        return postings

    def _term_scorer(self, *, fresh: bool = True) -> TermScorer | None:
        """The scorer of single words, its token counts read for this version (None: FTS5's `bm25()` reads).

        `fresh=False`: only its tokenizer is wanted; the counts are not read."""
        if not self._scorer_tried:
            self._scorer_tried = True
            from clawmem_index.index.bm25 import TermScorer

            try:
                self._scorer = TermScorer(self._conn, self._postings.token_counts())
            except apsw.Error:
                self._scorer = None
        if self._scorer is None or not fresh:
            return self._scorer
        if self._scorer_fresh is None:
            self._scorer_fresh = self._scorer.refresh()
        return self._scorer if self._scorer_fresh else None

    def _ranking(self, match: str, phrases: list[str]) -> tuple[Ints, Floats]:
        """Every matching seq (ascending) with its relevance: the phrases' gains added in phrase order, as
        FTS5's bm25 adds them (the last expression is kept: a caller reads deeper and deeper)."""
        import numpy as np

        if self._ranked is not None and self._ranked[0] == match:
            return self._ranked[1], self._ranked[2]
        lists = [self._phrase_postings(p) for p in phrases]
        self._lately = (self._state, {self._key(p): read for p, read in zip(phrases, lists, strict=True)})
        postings = sum(len(p.seqs) for p in lists)
        size = 1 + max((int(p.seqs[-1]) for p in lists if len(p.seqs)), default=-1)
        if size <= 8 * postings + (1 << 20):
            sums = np.zeros(size)
            matched = np.zeros(size, dtype=bool)
            for p in lists:
                sums[p.seqs] += p.gains
                matched[p.seqs] = True
            seqs = np.flatnonzero(matched)
            gains = sums[seqs]
        else:  # seqs too sparse for an array indexed by seq
            seqs, inverse = np.unique(np.concatenate([p.seqs for p in lists]), return_inverse=True)
            gains = np.zeros(len(seqs))
            start = 0
            for p in lists:
                gains[inverse[start:start + len(p.seqs)]] += p.gains
                start += len(p.seqs)
        self._ranked = (match, seqs, gains)
        return seqs, gains

    def _best(self, seqs: Ints, gains: Floats, limit: int, where: ChunkFilter | None) -> Ints | None:
        """Positions of the best `limit` (relevance descending, ties by seq) that pass `where`; None when a
        filter passes too few of the best FILTER_DEPTH."""
        import numpy as np

        depth = limit if not where else max(64, 4 * limit)
        while True:
            top = _top(gains, depth)
            if not where:
                return top[:limit]
            passing = self._passing(seqs[top], where)
            kept = top[np.isin(seqs[top], passing)]
            if len(kept) >= limit or len(top) == len(gains):
                return kept[:limit]
            if depth >= FILTER_DEPTH:
                return None
            depth *= 8

    def _passing(self, seqs: Ints, where: ChunkFilter) -> Ints:
        import numpy as np

        condition, args = where.sql("w")
        rows = self._conn.execute(
            f"SELECT w.seq FROM chunks AS w WHERE w.seq IN (SELECT value FROM json_each(:seqs)) AND {condition}",
            {**args, "seqs": json.dumps(seqs.tolist())})
        return np.fromiter((r[0] for r in rows), dtype=np.int64)

    def _hits(self, seqs: Ints, gains: Floats) -> list[TextHit]:
        return self.hits(list(zip(seqs.tolist(), (-gains).tolist(), strict=True)))

    def hits(self, ranked: Sequence[tuple[int, float]]) -> list[TextHit]:
        """The `TextHit`s of (seq, bm25) pairs, in their order (a seq without a chunk row is left out)."""
        rows = {int(r[0]): r for r in self._conn.execute(
            "SELECT seq, path, source, start_line, end_line, text, date FROM chunks"
            " WHERE seq IN (SELECT value FROM json_each(?))", (json.dumps([seq for seq, _ in ranked]),))}
        return [TextHit.of(rows[seq], bm25) for seq, bm25 in ranked if seq in rows]


def _top(gains: Floats, depth: int) -> Ints:
    """Positions of at least the `depth` largest gains (all that tie with the last), largest first, ties in
    position order."""
    import numpy as np

    if depth < len(gains):
        cut = np.partition(gains, len(gains) - depth)[len(gains) - depth]
        chosen = np.flatnonzero(gains >= cut)
    else:
        chosen = np.arange(len(gains))
    return chosen[np.argsort(-gains[chosen], kind="stable")]
