"""The annotations OpenClaw's writers append to a memory entry: metadata of the entry, not words to match.

    - Keep the gateway on loopback. <!-- trigger: gateway setup, network safety --> <!-- importance: 9 -->
    - Use the release helper. <!-- project: github.com/openclaw/openclaw -->

`trigger` phrases say when an entry of the curated memory (MEMORY.md, USER.md) should be put in front
of the model unasked; `importance` (1-10) weighs its ranking; `project` keys scope it to repositories.
The rules are OpenClaw memory-core's (packages/memory-host-sdk `curated-annotations`), so a workspace
reads the same under either: a comment is an annotation only when it closes on the line it opens on;
triggers and importance count only on a line that ends with a comment, and only in curated files;
project keys count anywhere in the span, in every memory file but the user profiles. An annotation
that cannot be read (a project key with `<` or `>`, an unclosed marker) marks the span's projects
invalid: it then matches no repository, so it is never shown as scoped to one. Pure functions: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["ANNOTATION_KINDS", "INVALID_PROJECTS", "Annotations", "Entry", "curated_entries", "embedding_text",
           "entry_spans", "read_annotations",
           "strip_annotations"]

ANNOTATION_KINDS = ("importance", "triggers", "projects")
INVALID_PROJECTS = "!invalid-project-annotation"  # memory-core's marker: matches no repository's key
_MARKER = re.compile(r"<!--\s*(trigger|importance|project)\s*:", re.IGNORECASE)
_PROJECT_MARKER = re.compile(r"<!--\s*(project)\s*:", re.IGNORECASE)
_LINE_BREAK = re.compile(r"[\r\n]")
_TRAILING_SPACE = re.compile(r"[ \t]+(?=[\r\n\u2028\u2029]|\Z)")
_ENTRY_START = re.compile(r"- |#{1,6}(?:\s|$)")


@dataclass(frozen=True)
class Annotations:
    """What a span's annotations say; None where they say nothing (the entry ranks as unannotated)."""

    importance: int | None = None
    triggers: str | None = None  # phrases joined with "; " (OpenClaw splits them on ";")
    projects: str | None = None  # keys joined with "; ", or INVALID_PROJECTS

    def __bool__(self) -> bool:
        return self.importance is not None or self.triggers is not None or self.projects is not None


@dataclass(frozen=True)
class Entry:
    """One entry of a curated file: a `- ` item (or a section) with the lines up to the next, 1-based."""

    start_line: int
    end_line: int
    text: str  # the entry's lines with the annotations taken out
    annotations: Annotations


def _scan(text: str, marker: re.Pattern[str], line_scoped: bool = False) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, kind, value) of each annotation: a marker up to the next `-->` (on its line, if `line_scoped`).

    The next `-->` and the next line break are looked for again only once the scan has passed them (as OpenClaw's
    scanner does), so a text of many markers and one far `-->` costs one pass, not one per marker."""
    pos = 0
    closing = newline = -1
    while (match := marker.search(text, pos)) is not None:
        value_start = match.end()
        if closing < value_start:
            closing = text.find("-->", value_start)
            if closing < 0:
                return
        if line_scoped:
            if newline < value_start:
                found = _LINE_BREAK.search(text, value_start)
                newline = found.start() if found is not None else len(text)
            if newline < closing:
                pos = value_start  # this one spans lines: not an annotation; one may open before its `-->`
                continue
        yield match.start(), closing + 3, match.group(1).lower(), text[value_start:closing].strip()
        pos = closing + 3


def strip_annotations(text: str) -> str:
    """`text` without its annotations (each closed on its own line); line breaks, and so line numbers, kept."""
    if "<!--" not in text:
        return text
    parts: list[str] = []
    cursor = 0
    for start, end, _, _ in _scan(text, _MARKER, line_scoped=True):
        parts.append(text[cursor:start])
        cursor = end
    if cursor == 0:
        return text
    parts.append(text[cursor:])
    return _TRAILING_SPACE.sub("", "".join(parts))


def embedding_text(text: str) -> str:
    """What a chunk's vector is made of: its words without the annotations (all of it, if nothing else is left)."""
    stripped = strip_annotations(text)
    return stripped if stripped.strip() else text


def _project_key(raw: str) -> str | None:
    """A repository key as OpenClaw compares them: its host lower-cased (`path:` keys as written), None if invalid."""
    key = raw.strip()
    if not key or any(c in key for c in "\r\n<>"):
        return None
    if key.startswith("path:"):
        return key
    slash = key.find("/")
    return key if slash < 1 else key[:slash].lower() + key[slash:]


def _projects(text: str) -> str | None:
    markers = len(_PROJECT_MARKER.findall(text))
    if not markers:
        return None
    keys: dict[str, None] = {}
    parsed = raw_count = valid = 0
    for _, _, _, value in _scan(text, _PROJECT_MARKER):
        parsed += 1
        for raw in value.split(";"):
            raw_count += 1
            if (key := _project_key(raw)) is not None:
                keys[key] = None
                valid += 1
    if parsed != markers or raw_count == 0 or raw_count != valid:
        return INVALID_PROJECTS
    return "; ".join(keys) or None


def _importance(value: str) -> int | None:
    """1 to 10 written in ASCII digits (leading zeros allowed, any length), else None."""
    if not (value.isascii() and value.isdigit()):
        return None
    digits = value.lstrip("0")
    return int(digits) if 1 <= len(digits) <= 2 and int(digits) <= 10 else None


def read_annotations(lines: Sequence[str], *, curated: bool, project_scoped: bool) -> Annotations:
    """The annotations of a span of lines (as in the file, comments included).

    `curated`: the span is in MEMORY.md or USER.md, where triggers and importance count;
    `project_scoped`: its file may be scoped to repositories (every memory file but the profiles).
    """
    projects = _projects("\n".join(lines)) if project_scoped else None
    phrases: dict[str, None] = {}
    importance: int | None = None
    for line in lines if curated else ():
        if not line.rstrip().endswith("-->"):
            continue
        for _, _, kind, value in _scan(line, _MARKER):
            if kind == "trigger":
                phrases.update((p, None) for p in (part.strip() for part in re.split(r"[,;]", value)) if p)
            elif kind == "importance" and (number := _importance(value)) is not None:
                importance = max(importance or 0, number)
    return Annotations(importance, "; ".join(phrases) or None, projects)


def entry_spans(text: str) -> list[tuple[int, int]]:
    """The 1-based (first, last) lines of a curated file's entries as OpenClaw cuts them: each `- ` line or heading
    starts one, which runs to the line before the next."""
    lines = text.split("\n")
    starts = [0] + [i for i in range(1, len(lines)) if _ENTRY_START.match(lines[i])]
    ends = [*starts[1:], len(lines)]
    return [(first + 1, last) for first, last in zip(starts, ends, strict=True)]


def curated_entries(text: str, *, project_scoped: bool) -> list[Entry]:
    """A curated file cut into its entries (`entry_spans`), each with its annotations (whether it has any or not)."""
    lines = text.split("\n")
    entries: list[Entry] = []
    for first, last in entry_spans(text):
        span = lines[first - 1:last]
        entries.append(Entry(first, last, strip_annotations("\n".join(span)),
                             read_annotations(span, curated=True, project_scoped=project_scoped)))
    return entries
