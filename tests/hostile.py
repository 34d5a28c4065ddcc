"""The hostile-input corpus: fixed cases and hypothesis strategies that every source and front door is run against.

Each source (memory files, transcripts, file names) and each front door (socket, CLI, `Client`, MCP stdio and HTTP,
`context`) has tests that feed it these inputs and check one invariant: the service keeps answering, the other files
are indexed, and any error is a defined one (a `ClawmemError`, a JSON-RPC error object, an MCP `isError` result or a
non-zero exit with a one-line message), never a traceback or a dropped connection.

The cases are plain data so that a test of a new surface is a loop over them, not a new list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import strategies as st

#: Texts a Python `str` can hold that are hostile to storage, JSON, terminals or tokenizers.
FIXED_TEXTS: dict[str, str] = {
    "lone high surrogate": "lone \ud800 high",
    "lone low surrogate": "lone \udc00 low",
    "reversed pair": "\ude00\ud83d backwards",
    "surrogate pair (valid)": "\U0001f600 smile",
    "surrogateescape byte": "raw \udcff byte",
    "nul": "nul \x00 inside",
    "controls": "bell \x07 esc \x1b[31m red \x1b[0m del \x7f",
    "bidi override": "admin\u202egnp.exe \u2066isolate\u2069",
    "zero width": "zero\u200bwidth\ufeffbom",
    "combining flood": "e" + "\u0301" * 500,
    "noncharacters": "\ufffe\uffff\U0010ffff",
    "line separators": "a\u2028b\u2029c\x85d",
    "crlf and cr": "one\r\ntwo\rthree",
    "huge line": "word " * 200_000,
    "huge number text": "9" * 5_000,
    "date flood": "March 3 and yesterday, " * 2_000,  # read quadratically once (issue 48)
    "unknown word flood": " ".join(f"{a}{b}qzxv{c}" for a in "bdfgklmnprst" for b in "aeiou" for c in "aeiou"),
    "cjk": "日本語のメモ 中文笔记 한국어",
    "empty": "",
    "whitespace only": " \t\n\n ",
    "fts syntax": 'NEAR("a" b) OR * ^ AND - "unterminated',
    "sql-ish": "'; DROP TABLE chunks; --",
}

#: Byte strings that are not valid UTF-8 (file contents, file names, transcript lines).
FIXED_BYTES: dict[str, bytes] = {
    "invalid continuation": b"bad \x80\x81 bytes",
    "truncated sequence": b"cut \xe2\x82",
    "overlong encoding": b"over \xc0\xaf long",
    "encoded surrogate": b"cesu \xed\xa0\x80 surrogate",
    "latin-1": "caf\xe9 na\xefve".encode("latin-1"),
    "utf-16 with bom": "\ufeffutf16 text".encode("utf-16"),
    "nul bytes": b"a\x00b\x00c",
}

#: File names (relative to `memory/`) that are legal on POSIX but hostile elsewhere.
FIXED_NAMES: dict[str, bytes] = {
    "non-utf8": b"b\xff.md",
    "newline": b"new\nline.md",
    "leading dash": b"-rf.md",
    "spaces": b"  spaced  .md",
    "bidi": "evil\u202edm.txt.md".encode(),
    "control": b"bell\x07.md",
    "backslash": b"back\\slash.md",
    "long": b"n" * 240 + b".md",
}


#: Contents of an MCP token file (`clawmem mcp --http --token-file`) that no HTTP client could send as a bearer token,
#: or that is not one token: each is refused at start with one line and exit 2.
FIXED_TOKEN_FILES: dict[str, bytes] = {
    "nul bytes": b"\x00" * 32,
    "nul inside": b"token-with-a-nul-\x00-0123456789",
    "non-ascii utf-8": "t\u00f6ken-with-\u00fcmlauts-0123456789".encode(),
    "latin-1 bytes": b"\xe9" * 24,
    "utf-16 with bom": "token-token-0123456789".encode("utf-16"),
    "control characters": b"token\x07with\x1b[31mcontrols-0123",
    "delete character": b"token-with-del-\x7f-0123456789",
    "space inside": b"two words token 0123456789",
    "two lines": b"first-token-0123456789\nsecond-token-0123456789\n",
    "empty": b"",
    "whitespace only": b"  \n\t\n",
    "too short": b"abc\n",
    "too long": b"a" * 100_000,
}


#: SQL any role of the shared index may run in its own session (temporary tables need no grant): tables named as
#: the schema's or the catalog's, each made to grant its role every workspace if a function looked names up in pg_temp.
FIXED_SQL_SHADOWS: dict[str, str] = {
    "cm_access": "CREATE TEMP TABLE cm_access(role_name name, workspace text, writable boolean);"
                 " INSERT INTO cm_access VALUES (current_user, 'beta', true), (current_user, 'alpha', true)",
    # every role's name, each with this role's own oid: "member of every role that holds a grant"
    "pg_roles": "CREATE TEMP TABLE pg_roles(rolname name, oid oid);"
                " INSERT INTO pg_roles SELECT rolname,"
                " (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)"
                " FROM pg_catalog.pg_roles",
}


def many_identical_chunks(size_bytes: int, line: str = "the same line again\n") -> str:
    """A document of identical lines, so that every chunk has the same text (a quadratic-id trap)."""
    return line * max(1, size_bytes // len(line))


def deep_json(depth: int) -> str:
    """A JSON text nested `depth` levels deep (arrays inside objects), as a parser-stack attack."""
    return '{"a":' * depth + "[" + "]" + "}" * depth


#: JSON texts that parse with Python's json module but carry hostile values.
FIXED_JSON: dict[str, str] = {
    "escaped lone surrogate": '{"text": "lone \\udc00 x"}',
    "escaped reversed pair": '{"text": "\\ude00\\ud83d"}',
    "huge integer": '{"n": ' + "9" * 5_000 + "}",
    "huge float": '{"n": 1e999999}',
    "nan": '{"n": NaN}',
    "deep nesting": deep_json(5_000),
    "duplicate keys": '{"a": 1, "a": 2}',
}


def transcript_line(text: str) -> str:
    """One session transcript line (OpenClaw format) whose user message is `text`, JSON-escaped as a model would."""
    return json.dumps({"type": "message", "message": {"role": "user", "content": text}})


#: Transcript lines: the fixed texts as user messages (escaped with ensure_ascii, so surrogates arrive as \\uXXXX).
FIXED_TRANSCRIPT_LINES: dict[str, str] = {name: transcript_line(text) for name, text in FIXED_TEXTS.items()}
FIXED_TRANSCRIPT_LINES.update({
    "raw escaped surrogate": '{"type":"message","message":{"role":"user","content":"lone \\udc00 x"}}',
    "content not a string": '{"type":"message","message":{"role":"user","content":{"x":[1,2]}}}',
    "deep nesting": '{"type":"message","message":' + deep_json(3_000) + "}",
    "huge integer timestamp": '{"type":"message","timestamp":' + "9" * 4_000
                              + ',"message":{"role":"user","content":"t"}}',
})


def hostile_text() -> st.SearchStrategy[str]:
    """Any Python text, weighted towards the characters that break storage and encoders."""
    special = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\x00", "\x1b", "\u202e", "\ufeff", "\r",
                               "\n", "\u2028", "\U0001f600", "日", "#", "`", '"', "*", "\\"])
    pieces = st.one_of(special, st.text(st.characters(), max_size=8))
    return st.lists(pieces, max_size=40).map("".join)


def hostile_bytes() -> st.SearchStrategy[bytes]:
    """Byte strings mixing valid UTF-8 with invalid sequences."""
    return st.one_of(
        st.binary(max_size=200),
        hostile_text().map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.sampled_from(list(FIXED_BYTES.values())),
    )


def hostile_name() -> st.SearchStrategy[bytes]:
    """A single path component ending in .md: any bytes but '/' and NUL."""
    raw = st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"/", b"_").replace(b"\x00", b"_"))
    return st.one_of(raw, st.sampled_from(list(FIXED_NAMES.values()))).map(
        lambda b: b if b.endswith(b".md") else b + b".md")


def make_long_path(base: Path, levels: int = 20) -> str:
    """A folder chain longer than PATH_MAX (made relative to descriptors, as only they can)."""
    name = "d" * 250
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open("deep.md", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"# Deep\nunreachable")
        os.close(out)
    finally:
        os.close(fd)
    return name


SENTINEL = "wolverine"  # a word only the good file of hostile_workspace holds


def hostile_workspace(workspace: Path) -> None:
    """Every fixed case as a memory file (by content and by name), all transcript lines, and one good note."""
    memory = workspace / "memory"
    (workspace / "MEMORY.md").write_text(f"# Memory\nThe {SENTINEL} decision stands.\n")
    # OpenClaw's annotations carrying every case: as trigger phrases, project keys and importance of entries.
    entries = [f"- entry {n} <!-- trigger: {text} --> <!-- project: {text} --> <!-- importance: {text} -->"
               for n, text in enumerate(FIXED_TEXTS.values())]
    (workspace / "USER.md").write_bytes(("# User\n" + "\n".join(entries) + "\n").encode("utf-8", "surrogatepass"))
    for n, text in enumerate(FIXED_TEXTS.values()):
        (memory / f"text-{n}.md").write_bytes(text.encode("utf-8", "surrogatepass"))
    for n, raw in enumerate(FIXED_BYTES.values()):
        (memory / f"bytes-{n}.md").write_bytes(raw)
    for raw in FIXED_NAMES.values():
        with open(os.path.join(os.fsencode(memory), raw), "wb") as fh:
            fh.write(b"a note under a hostile name\n")
    (memory / "same.md").write_text(many_identical_chunks(300_000))
    sessions = workspace / "sessions"
    sessions.mkdir()
    lines = [*FIXED_TRANSCRIPT_LINES.values(), json.dumps(
        {"type": "message", "message": {"role": "user", "content": f"the {SENTINEL} of the transcript"}})]
    (sessions / "hostile.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
