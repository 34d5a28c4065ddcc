"""The passive-injection block: the best search results as whole lines, grouped by file, within a token budget.

Agents put this block in their prompt before each turn (clawhive §3.4), so it must never cost
more than it was given: the budget is checked by counting the finished text itself, not by adding
up its parts (BPE tokens do not add up across a join). Pure: it knows nothing of sockets, files or
the index; the caller passes the search hits, a way to read lines and the token counter.

The shape of the block:

    ### MEMORY.md#L3-L7
    <lines 3 to 7>

    ### memory/2026-11-22.md#L12-L18
    <lines 12 to 18>

On a shared index a hit may be another workspace's: its section is labelled with that workspace
(`### beta:MEMORY.md#L3-L7`), so it cannot be taken for a file of this one, and its lines come
from wherever the caller reads that workspace (the index's chunk text).

Files come in the order of their best hit; the ranges of one file in line order, overlapping or
touching hits merged into one range. Lines are taken best hit first, each hit's from its top, and
a hit stops at its first line that does not fit (a range never has a hole, and no line is ever
cut); blank lines at the edges of a range are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["ContextBlock", "Hit", "Section", "build_context", "citation"]

ReadLines = Callable[[str | None, str, int, int], Sequence[str | None]]
"""(workspace, path, first, last) -> the file's lines first..last, fewer if the file is shorter; None for a
line that exists but cannot be shown whole (longer than the reader reads): it is left out, and counted as
such. `workspace` is None for this workspace's files."""
CountTokens = Callable[[str], int]

LABEL = "### "
SEPARATOR = "\n\n"


def citation(path: str, start_line: int, end_line: int, workspace: str | None = None) -> str:
    """`path#L12-L18` (or `path#L12` for one line): how a block labels a range and a tool cites one.

    Another workspace's range is `workspace:path#L12-L18` (workspace names hold no `:`).
    """
    lines = f"#L{start_line}" if start_line == end_line else f"#L{start_line}-L{end_line}"
    return f"{path}{lines}" if workspace is None else f"{workspace}:{path}{lines}"


@dataclass(frozen=True)
class Hit:
    """One search result, as far as the block needs it; `workspace` None: this workspace's."""

    path: str
    start_line: int
    end_line: int
    score: float
    workspace: str | None = None


@dataclass(frozen=True)
class Section:
    """One labelled range of one file; `workspace` None: this workspace's."""

    path: str
    start_line: int
    end_line: int
    score: float
    lines: tuple[str, ...]
    workspace: str | None = None

    @property
    def citation(self) -> str:
        return citation(self.path, self.start_line, self.end_line, self.workspace)

    def render(self) -> str:
        return LABEL + self.citation + "\n" + "\n".join(self.lines)

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"path": self.path, "start_line": self.start_line, "end_line": self.end_line,
                                   "score": round(self.score, 6), "citation": self.citation}
        if self.workspace is not None:
            data["workspace"] = self.workspace
        return data


@dataclass(frozen=True)
class ContextBlock:
    """The block and what it holds; `omitted_lines`: lines with text under the hits that the budget left out."""

    text: str
    tokens: int
    budget: int
    sections: tuple[Section, ...] = ()
    hits: int = 0
    omitted_lines: int = 0

    @property
    def truncated(self) -> bool:
        return self.omitted_lines > 0

    def as_dict(self) -> dict[str, object]:
        return {"text": self.text, "tokens": self.tokens, "budget": self.budget,
                "sections": [s.as_dict() for s in self.sections], "hits": self.hits,
                "truncated": self.truncated, "omitted_lines": self.omitted_lines}


_Key = tuple[str | None, str]  # (workspace, path): one file


@dataclass
class _File:
    workspace: str | None
    path: str
    hits: list[Hit]  # best first
    lines: dict[int, str | None] = field(default_factory=dict)  # line number -> text, of the lines under its hits
    taken: set[int] = field(default_factory=set)

    def score(self, first: int, last: int) -> float:
        """The best score of the hits over lines first..last."""
        return max((h.score for h in self.hits if h.start_line <= last and h.end_line >= first), default=0.0)


def build_context(hits: Iterable[Hit], read_lines: ReadLines, count_tokens: CountTokens, budget: int) -> ContextBlock:
    """The block for `hits` (best first) in at most `budget` tokens as `count_tokens` counts the whole text."""
    if budget < 0:
        raise ValueError("the budget must be >= 0 tokens")
    ordered = sorted(hits, key=lambda h: -h.score)  # stable: equal scores keep the search's order
    files = _read(ordered, read_lines)
    picks = _pick(ordered, files, count_tokens, budget)
    while True:  # the estimate only guides: the finished text is what must fit
        sections = _sections(files)
        text = SEPARATOR.join(s.render() for s in sections)
        tokens = count_tokens(text) if text else 0
        if tokens <= budget or not picks:
            break
        key, number = picks.pop()
        files[key].taken.discard(number)
    shown = sum(1 for s in sections for line in s.lines if line.strip())
    available = sum(1 for f in files.values() for line in f.lines.values() if line is None or line.strip())
    return ContextBlock(text, tokens, budget, tuple(sections), len(ordered), available - shown)


def _read(hits: Sequence[Hit], read_lines: ReadLines) -> dict[_Key, _File]:
    """Each file's lines under its hits, read once per merged range."""
    files: dict[_Key, _File] = {}
    for hit in hits:
        files.setdefault((hit.workspace, hit.path), _File(hit.workspace, hit.path, [])).hits.append(hit)
    for f in files.values():
        for first, last in _merge((h.start_line, h.end_line) for h in f.hits):
            lines = read_lines(f.workspace, f.path, first, last)
            for number, line in zip(range(first, last + 1), lines, strict=False):
                f.lines[number] = line
    return files


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching line ranges joined."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _pick(hits: Sequence[Hit], files: dict[_Key, _File], count_tokens: CountTokens,
          budget: int) -> list[tuple[_Key, int]]:
    """Lines in the order taken, estimated to fit: each costs its own tokens, each new range its label's."""
    picks: list[tuple[_Key, int]] = []
    spent = 0
    separator = count_tokens(SEPARATOR)
    for hit in hits:
        key = (hit.workspace, hit.path)
        f = files[key]
        for number in range(hit.start_line, hit.end_line + 1):
            if number in f.taken:
                continue
            line = f.lines.get(number)
            if line is None:
                break
            cost = count_tokens(line + "\n")
            if number - 1 not in f.taken and number + 1 not in f.taken:  # a new range: its label and gap
                label = citation(f.path, number, number, f.workspace)
                cost += count_tokens(LABEL + label + "\n") + (separator if picks else 0)
            if spent + cost > budget:
                break
            spent += cost
            f.taken.add(number)
            picks.append((key, number))
    return picks


def _sections(files: dict[_Key, _File]) -> list[Section]:
    """The taken lines as ranges: files by their best hit, ranges in line order, blank edges trimmed."""
    sections: list[Section] = []
    for f in files.values():  # in the order of their best hits
        taken = {n: line for n in f.taken if (line := f.lines[n]) is not None}
        for first, last in _merge((n, n) for n in taken):
            while first <= last and not taken[first].strip():
                first += 1
            while last >= first and not taken[last].strip():
                last -= 1
            if first <= last:
                sections.append(Section(f.path, first, last, f.score(first, last),
                                        tuple(taken[n] for n in range(first, last + 1)), f.workspace))
    return sections
