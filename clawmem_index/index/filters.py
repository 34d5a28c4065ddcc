"""What a search may return: the filter both the keyword and the vector index apply inside their candidate queries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ChunkFilter", "prefix_range", "prefix_upper"]


@dataclass(frozen=True, slots=True)
class ChunkFilter:
    """What a search may return: under a path, from one source, dated within [since, before).

    Applied inside the candidate queries (keyword and vector), never to a top-k already cut, which
    would lose matches. A date bound leaves out undated chunks (MEMORY.md, notes without a date).
    """

    path_prefix: str | None = None
    source: str | None = None
    since: str | None = None  # ISO date, inclusive
    before: str | None = None  # ISO date, exclusive

    def __bool__(self) -> bool:
        return any((self.path_prefix, self.source, self.since, self.before))

    @property
    def dated(self) -> bool:
        return self.since is not None or self.before is not None

    def sql(self, alias: str, *, dialect: str = "sqlite") -> tuple[str, dict[str, Any]]:
        """A condition on the chunks table under `alias`, for SQLite (`:name` placeholders; an index answers
        the path and date parts as ranges) or PostgreSQL (`%(name)s`; `starts_with` for the path)."""
        postgres = dialect == "postgres"
        clauses: list[str] = []
        args: dict[str, Any] = {}
        if self.path_prefix:
            if postgres:
                clauses.append(f"starts_with({alias}.path, %(prefix)s)")
                args["prefix"] = self.path_prefix
            else:
                clause, args = prefix_range(f"{alias}.path", self.path_prefix)
                clauses.append(clause)
        for column, op, name, value in (("source", "=", "source", self.source), ("date", ">=", "since", self.since),
                                        ("date", "<", "before", self.before)):
            if value:
                clauses.append(f"{alias}.{column} {op} " + (f"%({name})s" if postgres else f":{name}"))
                args[name] = value
        return " AND ".join(clauses) or ("true" if postgres else "1"), args


def prefix_range(column: str, prefix: str) -> tuple[str, dict[str, Any]]:
    """A condition for `column` starting with `prefix` that an index on it can answer as a range.

    Text compares as UTF-8 bytes, which order as code points: the strings starting with `prefix` are
    those from `prefix` up to (not including) `prefix` with its last character incremented.
    """
    args: dict[str, Any] = {"prefix": prefix, "n": len(prefix)}
    clause = f"{column} >= :prefix AND substr({column}, 1, :n) = :prefix"
    upper = prefix_upper(prefix)
    if upper is not None:
        clause += f" AND {column} < :upper"
        args["upper"] = upper
    return clause, args


def prefix_upper(prefix: str) -> str | None:
    """The least string past every string starting with `prefix` (its last character incremented), in code point
    (UTF-8 byte) order; None when there is none (it ends in U+10FFFF)."""
    following = ord(prefix[-1]) + 1
    if 0xD800 <= following < 0xE000:
        following = 0xE000  # surrogates are not characters
    return prefix[:-1] + chr(following) if following <= 0x10FFFF else None
