"""OpenClaw's entry annotations, read as memory-core reads them (its curated-annotations rules)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clawmem_index.text.annotations import (
    INVALID_PROJECTS,
    Annotations,
    curated_entries,
    embedding_text,
    read_annotations,
    strip_annotations,
)

LINE = "- Keep the gateway on loopback. <!-- trigger: gateway setup, network safety --> <!-- importance: 9 -->"


def test_annotations_are_taken_out_of_the_text_and_line_breaks_kept() -> None:
    assert strip_annotations(LINE) == "- Keep the gateway on loopback."
    text = f"# Facts\n{LINE}\n- plain <!-- a comment stays -->\n"
    assert strip_annotations(text) == "# Facts\n- Keep the gateway on loopback.\n- plain <!-- a comment stays -->\n"
    assert strip_annotations(text).count("\n") == text.count("\n")
    assert strip_annotations("x <!-- IMPORTANCE : 3 --> y") == "x  y"  # any case, spaces around the name


def test_an_annotation_that_does_not_close_on_its_line_is_text() -> None:
    spanning = "- a <!-- trigger: one\ntwo --> b"
    assert strip_annotations(spanning) == spanning
    assert read_annotations(spanning.split("\n"), curated=True, project_scoped=True) == Annotations()
    # ... but a later one on a line of its own still is one
    assert strip_annotations("- a <!-- trigger: x\n- b <!-- trigger: y -->") == "- a <!-- trigger: x\n- b"


def test_triggers_and_importance_count_in_curated_files_on_lines_ending_with_a_comment() -> None:
    assert read_annotations([LINE], curated=True, project_scoped=True) == Annotations(
        9, "gateway setup; network safety", None)
    assert read_annotations([LINE], curated=False, project_scoped=True) == Annotations()  # a daily note: none
    trailing = "- x <!-- trigger: a; b, a --> and more words"
    assert read_annotations([trailing], curated=True, project_scoped=False) == Annotations()
    several = ["- y <!-- importance: 3 -->", "  more <!-- importance: 7 -->", "<!-- trigger: b -->"]
    assert read_annotations(several, curated=True, project_scoped=False) == Annotations(7, "b", None)


def test_an_importance_outside_one_to_ten_or_not_a_number_is_ignored() -> None:
    for value in ("0", "11", "-3", "5.5", "high", "٣", "", "9" * 5000, "0" * 5000):
        assert read_annotations([f"- x <!-- importance: {value} -->"], curated=True,
                                project_scoped=False).importance is None, value
    assert read_annotations(["- x <!-- importance: 010 -->"], curated=True, project_scoped=False).importance == 10
    assert read_annotations([f"- x <!-- importance: {'0' * 5000}7 -->"], curated=True,
                            project_scoped=False).importance == 7


def test_project_keys_count_anywhere_and_their_hosts_compare_without_case() -> None:
    lines = ["- Use the release helper. <!-- project: GitHub.com/OpenClaw/openclaw; path:/src/App -->",
             "  still the entry <!-- project: github.com/OpenClaw/openclaw -->"]
    assert read_annotations(lines, curated=False, project_scoped=True).projects == (
        "github.com/OpenClaw/openclaw; path:/src/App")
    assert read_annotations(lines, curated=True, project_scoped=False).projects is None  # a user profile: never
    for bad in ("<!-- project: a<b -->", "<!-- project: ; -->", "<!-- project: x; -->", "<!-- project: unclosed"):
        assert read_annotations([f"- x {bad}"], curated=False, project_scoped=True).projects == INVALID_PROJECTS, bad


def test_a_curated_file_is_cut_into_its_entries_as_openclaw_cuts_it() -> None:
    text = "# Memory\n\n## Facts\n" + LINE + "\n  continued\n- second <!-- project: x/y -->\ntail\n"
    entries = curated_entries(text, project_scoped=True)
    assert [(e.start_line, e.end_line) for e in entries] == [(1, 2), (3, 3), (4, 5), (6, 8)]
    assert entries[2].text == "- Keep the gateway on loopback.\n  continued"
    assert entries[2].annotations == Annotations(9, "gateway setup; network safety", None)
    assert entries[3].annotations.projects == "x/y" and entries[3].text == "- second\ntail\n"
    assert not entries[0].annotations


def test_the_embedding_text_leaves_the_annotations_out_but_never_sends_nothing() -> None:
    assert embedding_text(LINE) == "- Keep the gateway on loopback."
    assert embedding_text("<!-- importance: 4 -->") == "<!-- importance: 4 -->"


_PIECES = st.sampled_from([*"ab \n\t-<!>:;,\r\u2028", "<!--", "-->", "trigger:", "project:", "importance:", "7"])


@given(st.lists(_PIECES, max_size=40).map("".join))
def test_reading_any_text_keeps_its_lines_and_never_fails(text: str) -> None:
    stripped = strip_annotations(text)
    assert stripped.count("\n") == text.count("\n")
    lines = text.split("\n")
    read_annotations(lines, curated=True, project_scoped=True)
    entries = curated_entries(text, project_scoped=True)
    assert entries[0].start_line == 1 and entries[-1].end_line == len(lines)
    assert all(a.end_line + 1 == b.start_line for a, b in zip(entries, entries[1:], strict=False))


def test_many_markers_and_one_far_closing_cost_one_pass() -> None:
    """A scan looked for the closing `-->` again from every marker: 4 MiB of unclosed markers took minutes (the
    suite's per-test timeout fails it); read once, it is one pass."""
    text = "<!-- trigger: x\n" * ((4 << 20) // 16) + "-->"
    assert strip_annotations(text) == text
    entries = curated_entries(text, project_scoped=True)
    assert len(entries) == 1 and not entries[0].annotations
