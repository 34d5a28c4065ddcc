"""FTS5's BM25 of one term over the whole table, computed from reads cheaper than `bm25()`.

Reading a common word's matches with FTS5's `bm25()` costs ~0.8 µs a row, most of it the function
looking up the row's token count (one B-tree read a row). The same numbers can be read in bulk: the
term's instances from an fts5vocab table (~0.1 µs each, all rows in one string) and every row's token
count from `chunks_fts_docsize`, kept here in an array indexed by rowid. FTS5 gives each row it
stores the `origin` its index's counter has then (the counter rises when rows are written out, and
not otherwise: rows of later transactions can share the highest origin seen), so after a change the
rows whose origin is at least the highest seen are read again, and nothing when FTS5's structure
record is unchanged (a commit that stored no row with a token, such as a batch of vectors); a
deleted row's count stays behind, harmless, since FTS5 lists no instance of it. Another file put in
place (a rebuild's swap) has its own `created_at` in `meta`, and its counts are all read again.
Connections to one file can share the counts (`SharedCounts`): the first to see a state reads what
changed and publishes a copy, the others take it (4 MB and 340 ms at 1M rows once, not once a thread).

The score is FTS5's formula (fts5_aux.c), operation for operation and in the same order, in numpy:
equal bit for bit to what `bm25()` returns for the term alone (tests/index/test_bm25.py checks it on
random tables, and `KeywordIndex` has FTS5 confirm the first answer after each change of its records).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable

import apsw
import numpy as np
import numpy.typing as npt

__all__ = ["SharedCounts", "TermScorer"]

K1 = 1.2  # FTS5's bm25() defaults
B = 0.75
TOKENIZER = ("porter", ["unicode61", "remove_diacritics", "2"])  # chunks_fts's tokenize option (schema.py)
VOCAB = "temp.clawmem_fts_instances"
AVERAGES_ROWID = 1  # FTS5's record of the row count and each column's total token count
STRUCTURE_ROWID = 10  # FTS5's record of its segments: rewritten whenever rows with tokens are stored
BATCH = 1 << 17  # token counts read at once
SPARSE = 8  # rowids per row beyond which the counts are not kept in an array indexed by rowid

Ints = npt.NDArray[np.int64]
Lengths = npt.NDArray[np.int32]  # token counts by rowid
Floats = npt.NDArray[np.float64]


class SharedCounts:
    """The token counts last read by one of the connections to a file, for the others that see the same
    state of it (the file's `created_at` and FTS5's structure record). Arrays put here are never written
    again: a connection that reads more copies first, since another may still be scoring with them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[Hashable, Lengths, int, bool] | None = None

    def get(self, state: Hashable) -> tuple[Lengths, int, bool] | None:
        """(counts by rowid, highest origin read, usable) for `state`, if held."""
        with self._lock:
            held = self._held
        return held[1:] if held is not None and held[0] == state else None

    def put(self, state: Hashable, lengths: Lengths, origin: int, usable: bool) -> None:
        lengths.flags.writeable = False
        with self._lock:
            self._held = (state, lengths, origin, usable)


class TermScorer:
    """Per-term BM25 gains (−bm25) of `chunks_fts` on one connection; call `refresh` in each read
    transaction whose data may differ from the last one's."""

    def __init__(self, conn: apsw.Connection, shared: SharedCounts | None = None) -> None:
        self._conn = conn
        self._shared = shared
        self._tokenize = conn.fts5_tokenizer(*TOKENIZER)
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {VOCAB} USING fts5vocab(main, chunks_fts, instance)")
        self._lengths: Lengths = np.zeros(0, dtype=np.int32)  # token counts by rowid (4 MB a million rows)
        self._origin = -1
        self._file: tuple[str] | None = None
        self._structure: bytes | None = None
        self._usable = True
        self._rows = 0
        self._avgdl = 0.0

    def refresh(self) -> bool:
        """Read the table's totals, and the token counts of rows stored since the last refresh.

        False when the rowids are too sparse for an array indexed by rowid (then `bm25()` scores)."""
        file = self._conn.execute("SELECT value FROM meta WHERE key = 'created_at'").fetchone()
        if file != self._file:
            self._lengths, self._origin, self._file, self._structure = np.zeros(0, dtype=np.int32), -1, file, None
        averages = self._record(AVERAGES_ROWID)
        totals = _varints(averages) if averages else [0]
        self._rows = totals[0]
        self._avgdl = float(sum(totals[1:])) / float(totals[0]) if totals[0] else 0.0
        structure = self._record(STRUCTURE_ROWID)
        if structure != self._structure:  # else no row with any token was stored since
            state = (file, structure)
            held = self._shared.get(state) if self._shared is not None else None
            if held is not None:
                self._lengths, self._origin, self._usable = held
            else:
                self._usable = self._read_counts()
                if self._shared is not None:
                    self._shared.put(state, self._lengths, self._origin, self._usable)
            self._structure = structure
        return self._usable

    def _record(self, rowid: int) -> bytes | None:
        row = self._conn.execute("SELECT block FROM chunks_fts_data WHERE id = ?", (rowid,)).fetchone()
        return None if row is None else bytes(row[0])

    def _read_counts(self) -> bool:
        """Read the counts of rows whose origin is at least the highest seen, BATCH rows at a time (the
        strings and arrays of a million rows at once would take ~300 MB)."""
        after, top = -1, self._origin
        while True:
            row = self._conn.execute(
                "SELECT group_concat(id), group_concat(length(sz)), group_concat(hex(sz), ''), max(origin), count(*)"
                " FROM (SELECT id, sz, origin FROM chunks_fts_docsize WHERE id > ? AND origin >= ? ORDER BY id"
                " LIMIT ?)", (after, self._origin, BATCH)).fetchone()
            assert row is not None  # an aggregate's one row
            ids, sizes, records, highest_origin, rows = row
            if not rows:
                break
            seqs = _ints(ids)
            highest = int(seqs[-1])
            if highest > SPARSE * self._rows + (1 << 20):
                self._lengths, self._origin = np.zeros(0, dtype=np.int32), -1
                return False
            if highest >= len(self._lengths):
                grown = np.zeros(max(highest + 1, len(self._lengths) * 5 // 4), dtype=np.int32)
                grown[:len(self._lengths)] = self._lengths
                self._lengths = grown
            elif not self._lengths.flags.writeable:  # shared: another connection may be scoring with it
                self._lengths = self._lengths.copy()
            self._lengths[seqs] = _varint_sums(bytes.fromhex(records), _ints(sizes))
            after, top = highest, max(top, int(highest_origin))
            if rows < BATCH:
                break
        self._origin = top
        return True

    def term(self, phrase: str) -> str | None:
        """The one token a quoted phrase (`"word"`) stands for; None for a prefix, several tokens or none."""
        if not (phrase.startswith('"') and phrase.endswith('"')):
            return None
        try:
            text = phrase[1:-1].replace('""', '"').encode()
        except UnicodeEncodeError:  # a lone surrogate: left to FTS5, which reports it
            return None
        tokens = list(self._tokenize(text, apsw.FTS5_TOKENIZE_QUERY, None))
        if len(tokens) != 1 or len(tokens[0]) != 3:
            return None
        return str(tokens[0][2])

    def gains(self, token: str) -> tuple[Ints, Floats]:
        """The rows holding `token` (ascending) and the relevance (−bm25) FTS5 gives each for it alone."""
        docs = self._conn.execute(f"SELECT group_concat(doc) FROM {VOCAB} WHERE term = ?", (token,)).get
        if not docs or not self._rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        instances = _ints(docs)
        if len(instances) > 1 and not bool(np.all(instances[1:] >= instances[:-1])):
            instances = np.sort(instances, kind="stable")
        starts = np.flatnonzero(np.concatenate(([True], instances[1:] != instances[:-1])))
        seqs = instances[starts]
        freq = np.diff(np.append(starts, len(instances))).astype(np.float64)
        hits = len(seqs)
        idf = math.log((self._rows - hits + 0.5) / (hits + 0.5))
        if idf <= 0.0:
            idf = 1e-6
        size = self._lengths[seqs].astype(np.float64)
        return seqs, idf * ((freq * (K1 + 1.0)) / (freq + K1 * ((1 - B) + B * size / self._avgdl)))


def _ints(text: str) -> Ints:
    """The integers of a `group_concat` (numpy's text parser: ~7x faster than splitting the string)."""
    values = np.fromstring(text, dtype=np.int64, sep=",")
    if len(values) != text.count(",") + 1:
        raise ValueError(f"not a list of integers: {text[:80]!r}")
    return values


def _varints(blob: bytes) -> list[int]:
    """SQLite's varints, one after another (FTS5's records of numbers)."""
    values: list[int] = []
    at = 0
    while at < len(blob):
        value = 0
        for used in range(9):
            byte = blob[at]
            at += 1
            if used == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if byte < 0x80:
                break
        values.append(value)
    return values


def _varint_sums(data: bytes, sizes: Ints) -> Ints:
    """Each record's sum of its varints (a docsize record: one token count a column), `sizes` bytes each.

    A varint's byte is worth its 7 low bits shifted by 7 for each byte after it in the varint (token
    counts never reach the 9-byte form); the few bytes with a byte after them are shifted in a loop."""
    raw = np.frombuffer(data, dtype=np.uint8)
    values = (raw & 0x7F).astype(np.int64)
    more = raw >= 0x80  # a byte of the same varint follows
    shifted = np.flatnonzero(more)
    following = 1
    while len(shifted):
        values[shifted] <<= 7
        shifted = shifted[more[np.minimum(shifted + following, len(raw) - 1)]]
        following += 1
    if not len(values):
        return np.zeros(len(sizes), dtype=np.int64)
    return np.add.reduceat(values, np.concatenate(([0], np.cumsum(sizes)[:-1])))
