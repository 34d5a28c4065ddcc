"""What an entry's annotations do to its ranking: importance, and the repositories it is scoped to.

OpenClaw's writers rate an entry `<!-- importance: N -->` (1-10) and scope it to repositories with
`<!-- project: KEY -->` (clawmem_index.text.annotations). The factors are memory-core's, so a
workspace ranks alike under either: importance multiplies a score by 0.75 + 0.05 N (0.80 to 1.25;
an entry without one keeps its score), and while a request names the repositories being worked in,
an entry scoped to all of its own among them gets 1.15, one scoped elsewhere (or unreadably) 0.90,
an unscoped one 1. A chunk's annotations are those of the entries it holds. Without annotations in
the index nothing is looked up and every factor is 1: the ranking is exactly what it was.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from clawmem_index.search.candidates import Candidate
from clawmem_index.text.annotations import INVALID_PROJECTS, Annotations

__all__ = ["Boosts", "importance_factor", "most_boost", "project_factor"]

IN_PROJECT, OTHER_PROJECT = 1.15, 0.90
MOST_IMPORTANT = 1.25


def most_boost(kinds: Collection[str], projects: Collection[str]) -> float:
    """The most any chunk's score can be multiplied by, given the annotations the index holds and the request's
    repositories: what bounds a chunk not read yet (1 when nothing can lift one)."""
    return (MOST_IMPORTANT if "importance" in kinds else 1.0) * (
        IN_PROJECT if projects and "projects" in kinds else 1.0)


def importance_factor(importance: int | None) -> float:
    if importance is None:
        return 1.0
    return 0.75 + max(1, min(10, importance)) * 0.05


def project_factor(projects: str | None, active: Collection[str]) -> float:
    """1.15 when every repository an entry is scoped to is active, 0.90 when some is not, 1 unscoped or no active."""
    if not active or projects is None:
        return 1.0
    keys = {key.strip() for key in projects.split(";")} - {""}
    if not keys or INVALID_PROJECTS in keys:
        return OTHER_PROJECT
    return IN_PROJECT if keys <= set(active) else OTHER_PROJECT


class Boosts:
    """Each candidate's factor from its annotations, looked up once per chunk (`prepare`, a batch at a time)."""

    def __init__(self, lookup: Callable[[Collection[int]], dict[int, Annotations]],
                 projects: Iterable[str] = ()) -> None:
        self._lookup = lookup
        self._projects = frozenset(projects)
        self._known: dict[int, Annotations | None] = {}

    def prepare(self, cands: Iterable[Candidate]) -> None:
        missing = [c.seq for c in cands if c.seq not in self._known]
        if missing:
            found = self._lookup(missing)
            self._known.update((seq, found.get(seq)) for seq in missing)

    def annotations(self, seq: int) -> Annotations | None:
        return self._known.get(seq)

    def __call__(self, c: Candidate) -> float:
        notes = self._known.get(c.seq)
        if notes is None:
            return 1.0
        return importance_factor(notes.importance) * project_factor(notes.projects, self._projects)
