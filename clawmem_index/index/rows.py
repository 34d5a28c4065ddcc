"""The rows both stores (SQLite and PostgreSQL) hand out: an indexed file, a chunk, a batch job, a search's hits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

__all__ = ["ChunkRow", "FileRow", "Hit", "JobRow", "TextHit", "VectorHit"]


@dataclass(frozen=True, slots=True)
class FileRow:
    """`state` is what an incremental source keeps between syncs (a transcript's indexed length), as JSON."""

    path: str
    source: str
    hash: str
    mtime: int
    size: int
    state: str = ""


@dataclass(frozen=True, slots=True)
class ChunkRow:
    seq: int
    id: str
    path: str
    start_line: int
    end_line: int
    hash: str
    text: str


@dataclass(frozen=True, slots=True)
class JobRow:
    """A provider batch job the index waits on: which chunk texts (by hash) it embeds."""

    id: str
    provider: str
    model: str
    provider_key: str
    hashes: tuple[str, ...]
    submitted_at: float
    polled_at: float
    state: str = "running"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Hit:
    """A chunk a search found: where it is and its text (each kind of search adds its score)."""

    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str

    @classmethod
    def of(cls, row: Sequence[Any], score: float) -> Self:
        """From a chunk's columns: seq, path, source, start_line, end_line, text, date and (a shared index's)
        workspace; `score` is the search's."""
        return cls(row[0], row[1], row[2], row[3], row[4], row[5], score, row[6],  # type: ignore[call-arg]
                   row[7] if len(row) > 7 else None)


@dataclass(frozen=True, slots=True)
class TextHit(Hit):
    """A chunk a keyword search found, with its BM25 score (FTS5's: lower is better)."""

    bm25: float
    date: str | None = None
    workspace: str | None = None  # set by a shared index (the workspace the chunk is from)


@dataclass(frozen=True, slots=True)
class VectorHit(Hit):
    """A chunk a vector search found, with its cosine distance."""

    distance: float
    date: str | None = None
    workspace: str | None = None  # set by a shared index (the workspace the chunk is from)
