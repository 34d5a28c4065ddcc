"""Keyword search in the shared index: FTS5's BM25, computed in PostgreSQL.

BM25 is computed from the terms `terms.chunk_terms` keeps per chunk and each workspace's term
statistics (`cm_terms`, `cm_stats`), which the store keeps in step in the same transaction as the
chunks. One query ranks a search; a long-lived reader keeps each phrase's matches instead and sums
them in numpy (`_PostingsCache`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from clawmem_index.index.filters import ChunkFilter, prefix_upper
from clawmem_index.index.rows import TextHit
from clawmem_index.index.pg.connection import Connection
from clawmem_index.index.pg.live import Live, filter_sql
from clawmem_index.index.pg.terms import Phrase, phrase_count, phrases_of
from clawmem_index.text.keywords import index_text
from clawmem_index.text.stemming import tokens as fts5_tokens

__all__ = ["KeywordSearch"]

K1, B = 1.2, 0.75  # FTS5's bm25() defaults
VOCABULARY_HELD = 200_000  # stems kept per version of the workspaces in scope, in all blocks (~20 MB)
VOCABULARY_ROWS = 5_000  # stems read for one prefix at most (more: None, and the caller asks a longer prefix)


class _PostingsCache:
    """Each phrase's matches in one workspace's generation at one version: chunk numbers, term
    frequencies and lengths, read once (one query) and kept while the version stands.

    BM25 of an OR of phrases is then summed in numpy: a phrase's document frequency is its number
    of matches, N and the average length come from `cm_stats` (kept per version too). The same
    sums `_bm25`'s query makes, without sending every matching chunk's terms through it again.
    Bounded by the matches held (least recently used dropped).
    """

    LIMIT = 1 << 21

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._held = 0
        self._entries: OrderedDict[tuple[str, int, int, Phrase], tuple[Any, Any, Any]] = OrderedDict()
        self._stats: dict[tuple[str, int, int], tuple[int, int]] = {}
        # one query's sums: its ranking, then its scores
        self._last: tuple[object, tuple[Any, Any] | None] = (None, None)

    def bm25(self, phrases: list[Phrase], live: list[tuple[str, int]], versions: dict[str, int], *,
             limit: int | None, seqs: list[int] | None) -> list[tuple[int, float]]:
        import numpy as np

        keys = [(w, g, versions.get(w, -1)) for w, g in live]
        summed = self._last[1] if self._last[0] == (keys, phrases) else None
        if summed is None:
            summed = self._sums(phrases, keys)
            self._last = ((keys, phrases), summed)
        if summed is None:
            return []
        matched, gains = summed
        if seqs is not None:
            picked = np.isin(matched, np.asarray(seqs, dtype=np.int64))
            return [(int(q), -float(g)) for q, g in zip(matched[picked], gains[picked], strict=True)]
        if limit is not None and limit < len(matched):
            floor = np.partition(gains, len(gains) - limit)[len(gains) - limit]
            keep = gains >= floor
            matched, gains = matched[keep], gains[keep]
        order = np.lexsort((matched, -gains))[:limit]
        return [(int(matched[i]), -float(gains[i])) for i in order]

    def _sums(self, phrases: list[Phrase], keys: list[tuple[str, int, int]]) -> tuple[Any, Any] | None:
        """Every matching chunk and its BM25 relevance, summed over the phrases in their order (as FTS5 does)."""
        import numpy as np

        chunks = tokens = 0
        for key in keys:
            n, t = self._stats_of(*key)
            chunks, tokens = chunks + n, tokens + t
        avgdl = (tokens / chunks if chunks else 1.0) or 1.0
        all_seqs, all_gains = [], []
        for phrase in phrases:
            found = [self._phrase(key, phrase) for key in keys]
            df = sum(len(f[0]) for f in found)
            if not df:
                continue
            idf = math.log((chunks - df + 0.5) / (df + 0.5)) if chunks else 0.0
            idf = idf if idf > 0 else 1e-6
            for seq, tf, length in found:
                all_seqs.append(seq)
                all_gains.append(idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avgdl)))
        if not all_seqs:
            return None
        # Each phrase's matches are in chunk order: a stable sort merges the runs, keeping phrase order per chunk.
        seqs = np.concatenate(all_seqs)
        order = np.argsort(seqs, kind="stable")
        seqs, gains = seqs[order], np.concatenate(all_gains)[order]
        starts = np.flatnonzero(np.concatenate(([True], seqs[1:] != seqs[:-1])))
        return seqs[starts], np.add.reduceat(gains, starts)

    def _stats_of(self, workspace: str, gen: int, version: int) -> tuple[int, int]:
        key = (workspace, gen, version)
        if key not in self._stats:
            row = self._conn.execute("SELECT chunks, tokens FROM cm_stats WHERE workspace = %s AND gen = %s",
                                     (workspace, gen)).fetchone()
            if len(self._stats) > 256:
                self._stats.clear()
            self._stats[key] = (int(row[0]), int(row[1])) if row else (0, 0)
        return self._stats[key]

    def _phrase(self, key: tuple[str, int, int], phrase: Phrase) -> tuple[Any, Any, Any]:
        import numpy as np

        entry = self._entries.get((*key, phrase))
        if entry is not None:
            self._entries.move_to_end((*key, phrase))
            return entry
        workspace, gen, _ = key
        row: Any  # the chunks' seqs, term frequencies and lengths, as three arrays (None: no chunk)
        if phrase.words:
            row = self._phrase_row(workspace, gen, phrase)
        elif phrase.prefix:
            pattern = phrase.term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            row = self._conn.execute(
                "WITH t AS (SELECT coalesce(array_agg(term), '{}') AS terms FROM (SELECT term FROM cm_terms"
                "   WHERE workspace = %(w)s AND gen = %(g)s AND term LIKE %(p)s ORDER BY term LIMIT 4096) AS m)"
                " SELECT array_agg(c.seq ORDER BY c.seq), array_agg((SELECT sum(u.tf) FROM unnest(c.terms, c.counts)"
                "   AS u(term, tf) WHERE u.term = ANY(t.terms)) ORDER BY c.seq), array_agg(c.length ORDER BY c.seq)"
                " FROM cm_chunks AS c, t WHERE c.workspace = %(w)s AND c.gen = %(g)s AND c.terms && t.terms",
                {"w": workspace, "g": gen, "p": pattern}, binary=True).fetchone()
        else:
            row = self._conn.execute(
                "SELECT array_agg(c.seq ORDER BY c.seq), array_agg(c.counts[array_position(c.terms, %(t)s)]"
                " ORDER BY c.seq), array_agg(c.length ORDER BY c.seq) FROM cm_chunks AS c"
                " WHERE c.workspace = %(w)s AND c.gen = %(g)s AND c.terms @> ARRAY[%(t)s]::text[]",
                {"w": workspace, "g": gen, "t": phrase.term}, binary=True).fetchone()
        seqs, tfs, lengths = row if row and row[0] is not None and len(row[0]) else ([], [], [])
        entry = (np.asarray(seqs, dtype=np.int64), np.asarray(tfs, dtype=np.float64),
                 np.asarray(lengths, dtype=np.float64))
        self._entries[(*key, phrase)] = entry
        self._held += len(entry[0])
        while self._held > self.LIMIT and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self._held -= len(dropped[0])
        return entry


    def _phrase_row(self, workspace: str, gen: int, phrase: Phrase) -> tuple[list[int], list[int], list[int]]:
        """A quoted phrase's chunks (those holding all its words, then read for them next to each other)."""
        seqs, tfs, lengths = [], [], []
        for seq, text, length in self._conn.execute(
                "SELECT c.seq, c.text, c.length FROM cm_chunks AS c WHERE c.workspace = %(w)s AND c.gen = %(g)s"
                " AND c.terms @> %(t)s::text[] ORDER BY c.seq",
                {"w": workspace, "g": gen, "t": list(dict.fromkeys(phrase.words))}):
            found = phrase_count(fts5_tokens(index_text(text)), phrase.words)
            if found:
                seqs.append(int(seq))
                tfs.append(found)
                lengths.append(int(length))
        return seqs, tfs, lengths


class KeywordSearch:
    """BM25 ranking of the chunks a store's searches read (`live`), on its connection."""

    def __init__(self, live: Live, *, keep_postings: bool = False) -> None:
        """`keep_postings`: keep each phrase's matches per workspace version and rank common words in
        numpy (a long-lived reader, the daemon's); otherwise every ranking is one query."""
        self.conn = live.conn
        self._live = live
        self._postings = _PostingsCache(live.conn) if keep_postings else None
        self._vocabulary: tuple[object, dict[str, dict[str, int] | None]] = (None, {})
        self._vocabulary_count = 0  # stems held in all blocks

    def search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        return self.hits(self.ranking(match, limit, where))

    def ranking(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the best `limit` chunks, best first, bm25 negative as FTS5's (ties by seq)."""
        return self._bm25(match, limit=limit, where=where)

    def scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return {}
        return dict(self._bm25(match, seqs=wanted))

    def vocabulary(self, prefix: str) -> dict[str, int] | None:
        """The stems the chunks in scope hold that begin with `prefix`, each with how many chunks hold it (None:
        more than VOCABULARY_ROWS do); the primary key of `cm_terms`, in byte order, serves the range; kept while
        the versions stand."""
        if not prefix:
            return {}
        state = (tuple(self._live.generations), tuple(sorted(self._live.versions.items()))) \
            if self._live.read and not self.conn.in_transaction else None
        if state is None or self._vocabulary[0] != state or self._vocabulary_count > VOCABULARY_HELD:
            self._vocabulary, self._vocabulary_count = (state, {}), 0
        held = self._vocabulary[1]
        if prefix not in held:
            scope, args = self._live.sql("t")
            upper = prefix_upper(prefix)
            found = {str(term): int(df) for term, df in self.conn.execute(
                f"SELECT t.term, sum(t.df) FROM cm_terms AS t WHERE {scope} AND t.term >= %(lo)s"
                + (" AND t.term < %(hi)s" if upper else "") + " GROUP BY t.term ORDER BY t.term LIMIT %(rows)s",
                {**args, "lo": prefix, "hi": upper, "rows": VOCABULARY_ROWS + 1}) if str(term).startswith(prefix)}
            held[prefix] = None if len(found) > VOCABULARY_ROWS else found
            self._vocabulary_count += 1 + len(found)
        return held[prefix]

    def _bm25(self, match: str, *, limit: int | None = None, where: ChunkFilter | None = None,
              seqs: list[int] | None = None) -> list[tuple[int, float]]:
        phrases = phrases_of(match)
        if not phrases or limit == 0:
            return []
        if self._postings is not None and not where and not self.conn.in_transaction and self._live.read:
            return self._postings.bm25(phrases, self._live.generations, self._live.versions, limit=limit, seqs=seqs)
        if any(p.words for p in phrases):  # a quoted phrase is read from the chunks' text: summed in numpy
            return self._phrase_bm25(phrases, limit=limit, where=where, seqs=seqs)
        scope, args = self._live.sql("c")
        n, avgdl = self._collection_stats()
        terms: list[str] = []
        phrase_of: list[int] = []
        idfs: list[float] = []
        for i, (phrase, matched) in enumerate(self._expand(phrases)):
            df = self._df(phrase, matched)
            idf = math.log((n - df + 0.5) / (df + 0.5)) if n else 0.0
            idf = idf if idf > 0 else 1e-6
            for term in matched:
                terms.append(term)
                phrase_of.append(i)
                idfs.append(idf)
        if not terms:
            return []
        condition, filter_args = filter_sql(where, "c")
        among = " AND c.seq = ANY(%(seqs)s)" if seqs is not None else ""
        order = "" if seqs is not None else " ORDER BY bm25, c.seq LIMIT %(limit)s"
        rows = self.conn.execute(
            "SELECT c.seq, -sum(p.idf * p.tf * %(k1p)s / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * c.length / %(avgdl)s)))"
            " AS bm25 FROM cm_chunks AS c CROSS JOIN LATERAL ("
            "   SELECT m.phrase, max(m.idf) AS idf, sum(u.tf)::float8 AS tf"
            "   FROM unnest(c.terms, c.counts) AS u(term, tf)"
            "   JOIN unnest(%(terms)s::text[], %(phrases)s::int[], %(idfs)s::float8[]) AS m(term, phrase, idf)"
            "   ON m.term = u.term GROUP BY m.phrase) AS p"
            f" WHERE c.terms && %(terms)s::text[] AND {scope} AND {condition}{among}"
            f" GROUP BY c.seq{order}",
            {**args, **filter_args, "terms": terms, "phrases": phrase_of, "idfs": idfs, "k1": K1, "k1p": K1 + 1,
             "b": B, "avgdl": avgdl, "seqs": seqs, "limit": limit}).fetchall()
        return [(int(seq), float(score)) for seq, score in rows]

    def _phrase_bm25(self, phrases: list[Phrase], *, limit: int | None, where: ChunkFilter | None,
                     seqs: list[int] | None) -> list[tuple[int, float]]:
        """BM25 of an expression with a quoted phrase, from each phrase's matches: a long-lived reader's kept ones
        (filtered after), else read for this ranking."""
        kept = self._postings is not None and not self.conn.in_transaction and self._live.read
        cache = self._postings if kept and self._postings is not None else _PostingsCache(self.conn)
        summed = cache.bm25(phrases, self._live.generations, self._live.versions if kept else {},
                            limit=None if where else limit, seqs=seqs)
        if not where or not summed:
            return summed
        scope, args = self._live.sql("c")
        condition, filter_args = filter_sql(where, "c")
        passing = {int(r[0]) for r in self.conn.execute(
            f"SELECT c.seq FROM cm_chunks AS c WHERE c.seq = ANY(%(seqs)s) AND {scope} AND {condition}",
            {**args, **filter_args, "seqs": [seq for seq, _ in summed]})}
        passed = [hit for hit in summed if hit[0] in passing]
        return passed if limit is None else passed[:limit]

    def _collection_stats(self) -> tuple[int, float]:
        row = self.conn.execute(
            "SELECT coalesce(sum(chunks), 0), coalesce(sum(tokens), 0) FROM cm_stats AS c WHERE "
            + self._live.sql("c")[0], self._live.sql("c")[1]).fetchone()
        n, tokens = (int(row[0]), int(row[1])) if row else (0, 0)
        return n, (tokens / n if n else 1.0) or 1.0

    def _expand(self, phrases: list[Phrase]) -> list[tuple[Phrase, list[str]]]:
        """Each phrase with the indexed terms it matches (a prefix: every term it begins)."""
        scope, args = self._live.sql("t")
        out = []
        for phrase in phrases:
            if not phrase.prefix:
                out.append((phrase, [phrase.term]))
                continue
            pattern = phrase.term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            found = [str(r[0]) for r in self.conn.execute(
                f"SELECT DISTINCT t.term FROM cm_terms AS t WHERE {scope} AND t.term LIKE %(pattern)s ORDER BY 1"
                " LIMIT 4096", {**args, "pattern": pattern})]
            out.append((phrase, found))
        return out

    def _df(self, phrase: Phrase, matched: list[str]) -> int:
        """How many chunks in scope hold the phrase (a prefix's terms may share chunks: counted once)."""
        if not matched:
            return 0
        if not phrase.prefix:
            scope, args = self._live.sql("t")
            row = self.conn.execute(f"SELECT coalesce(sum(t.df), 0) FROM cm_terms AS t WHERE {scope}"
                                    " AND t.term = %(term)s", {**args, "term": matched[0]}).fetchone()
        else:
            scope, args = self._live.sql("c")
            row = self.conn.execute(f"SELECT count(*) FROM cm_chunks AS c WHERE {scope}"
                                    " AND c.terms && %(terms)s::text[]", {**args, "terms": matched}).fetchone()
        return int(row[0]) if row else 0

    def hits(self, ranked: Sequence[tuple[int, float]]) -> list[TextHit]:
        rows = self._live.rows([seq for seq, _ in ranked])
        return [TextHit.of(rows[seq], bm25) for seq, bm25 in ranked if seq in rows]
