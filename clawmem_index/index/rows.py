"""The rows both stores (SQLite and PostgreSQL) hand out: an indexed file, a chunk, a batch job."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkRow", "FileRow", "JobRow"]


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
