"""Agent transcripts (`sessions/**/*.jsonl`) -> chunks of their user and assistant text.

A transcript is the OpenClaw/clawhive session log: one JSON object per line, appended as the
conversation goes, never rewritten. Line types: a `session` header (its `timestamp` dates
messages that have none), `message` (`{"role": ..., "content": "text" | [parts]}` under
`message`), and others (`tool_call`, `tool_result`, `compaction`, `model_change`...) that are
not conversation. Only user and assistant text is indexed: tool calls and results, thinking and
system text are noise for memory search.

Each message becomes `User: ...` / `Assistant: ...` lines, chunked with the Markdown token
windows (`clawmem_index.text.chunking.chunk_lines`, a message start being the preferred break), and every
chunk maps back to the 1-based JSONL lines of the messages it covers and is dated by its first
message (UTC).

Because transcripts only grow, a sync reads only what was appended since the last one: the file's
`state` remembers the byte offset consumed (always the end of a complete line, so a line still
being written is left for later), the line count, and hashes of the file's first bytes and of the
bytes just before the offset. If the file grew and both samples still match, only the new bytes
are read; otherwise (shrunk, rewritten, another chunking, an older state) it is read whole. An
edit between the two samples goes unseen: transcripts are append-only by contract.
New messages are windowed together with the file's last chunk, so a transcript synced after
every message gets the chunks one read of the whole file would give, not one short chunk per
sync: the state carries the messages from the start of the last chunk that opens a message
(where a whole read also starts a chunk), and an append replaces the chunks from there on
(`Transcript.rewindow_from`; their vectors come back from the embedding cache when the text is
unchanged). Messages are carried, not read again, so an append costs its own bytes even after a
huge tool result; past CARRY_CHARS of carried text the next append starts a fresh chunk instead.
A read from the start replaces every chunk of the file.

All reads go through `TranscriptReader`, which counts the bytes it takes from the file, so the
cost of a sync is observable (and tested) rather than assumed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from clawmem_index.text.chunking import HEADING, LINE, chunk_lines, split_lines
from clawmem_index.text.storable import storable

__all__ = [
    "SAMPLE_BYTES",
    "STATE_VERSION",
    "Message",
    "SessionChunk",
    "TailState",
    "Transcript",
    "TranscriptReader",
    "chunk_messages",
    "chunk_transcript",
    "describe_malformed",
    "describe_oversized",
    "read_transcript",
]

STATE_VERSION = 2  # bump when parsing, rendering or the state changes: older states then read their files whole
CARRY_CHARS = 32_768  # message text kept in the state to window with the next append; more: start afresh
SAMPLE_BYTES = 4096  # head and tail samples that tell an append from a rewrite
_BLOCK = 1 << 16
_ROLES = {"user": "User", "assistant": "Assistant"}
_MS_THRESHOLD = 1e11  # epoch numbers above this are milliseconds (1e11 s is the year 5138)
_MALFORMED_SHOWN = 5  # line numbers named in a report


@dataclass(frozen=True, slots=True)
class Message:
    """One user or assistant message: its JSONL line, speaker, text and UTC date (None if unknown)."""

    line: int
    role: str
    text: str
    date: str | None


@dataclass(frozen=True, slots=True)
class SessionChunk:
    start_line: int
    end_line: int
    text: str
    hash: str
    date: str | None
    opens: int | None = None  # index of the message this chunk starts with, if it starts at its first line


@dataclass(frozen=True, slots=True)
class TailState:
    """What was indexed of a transcript, kept as JSON in the files table between syncs."""

    offset: int  # bytes consumed: the end of the last complete line
    lines: int  # complete lines consumed
    head: str  # xxh3_64 of the first min(offset, SAMPLE_BYTES) bytes
    tail: str  # xxh3_64 of the min(offset, SAMPLE_BYTES) bytes before `offset`
    header_date: str | None  # the session header's date, for later messages without a timestamp
    malformed: int  # malformed lines so far
    chunking: tuple[int, int, str]  # (tokens, overlap, tokenizer) the chunks were made with
    carry: tuple[Message, ...] = ()  # the messages from the last chunk's start, windowed again with new ones

    def to_json(self) -> str:
        return json.dumps({"v": STATE_VERSION, "offset": self.offset, "lines": self.lines, "head": self.head,
                           "tail": self.tail, "header_date": self.header_date, "malformed": self.malformed,
                           "chunking": list(self.chunking),
                           "carry": [[m.line, m.role, m.text, m.date] for m in self.carry]}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> TailState | None:
        """The state stored for a file, or None if there is none usable (missing, damaged, another version)."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
                return None
            tokens, overlap, tokenizer = data["chunking"]
            carry = tuple(_carried(item) for item in data["carry"])
            state = TailState(int(data["offset"]), int(data["lines"]), str(data["head"]), str(data["tail"]),
                              data["header_date"] if isinstance(data["header_date"], str) else None,
                              int(data["malformed"]), (int(tokens), int(overlap), str(tokenizer)), carry)
        except (ValueError, TypeError, KeyError):
            return None
        ordered = all(a.line < b.line for a, b in itertools.pairwise(carry))
        usable = state.offset >= 0 and state.lines >= 0 and ordered and all(m.line <= state.lines for m in carry)
        return state if usable else None


def _carried(item: object) -> Message:
    """A carried message from its JSON form; ValueError when it is not one."""
    if not isinstance(item, list) or len(item) != 4:
        raise ValueError("not a carried message")
    line, role, text, date = item
    if (not isinstance(line, int) or isinstance(line, bool) or line < 1 or role not in _ROLES.values()
            or not isinstance(text, str) or not (date is None or isinstance(date, str))):
        raise ValueError("not a carried message")
    return Message(line, role, text, date)


@dataclass
class Transcript:
    """What one read of a transcript found: new messages, from the start or from a previous state."""

    messages: list[Message]
    state: TailState
    whole: bool  # read from the start: the file's previous chunks are void
    malformed_lines: list[int] = field(default_factory=list)  # line numbers of the lines skipped this read
    bytes_read: int = 0
    rewindow_from: int | None = None  # the file's chunks from this JSONL line on are made again from `messages`
    oversized_lines: list[int] = field(default_factory=list)  # lines longer than the bound, skipped unread
    complete: bool = True  # False: the read stopped at its byte budget, the rest is for another read


class TranscriptReader:
    """Reads one open descriptor by offset, never past `size`, and counts every byte it takes.

    `size` is the fstat size when the file was opened: bytes appended while a sync runs are left
    for the next one (whose stat will differ), so the stored size always matches what was read.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.bytes_read = 0
        self.stopped = False  # the last `lines` ended at its budget, before the file's end

    def pread(self, count: int, offset: int) -> bytes:
        count = max(0, min(count, self.size - offset))
        data = os.pread(self.fd, count, offset) if count else b""
        self.bytes_read += len(data)
        return data

    def lines(self, offset: int, *, max_line: int = 0, budget: int = 0) -> Iterator[tuple[bytes | None, int]]:
        """Complete lines from `offset` (without their newline), each with the offset just after it.

        A last line without its newline is a write in progress: it is not yielded. Each block is
        searched once, so a line of any length costs time linear in its length. A line longer than
        `max_line` is yielded as None, its bytes dropped as they are read (one 50 MB line held whole
        took the daemon to 344 MB); with a `budget`, no line starts after that many bytes (`stopped`).
        """
        self.stopped = False
        buf = bytearray()
        origin = pos = offset  # file offsets of buf[0] and of the next block
        skipping = False  # inside a line longer than max_line
        while pos < self.size:
            block = self.pread(_BLOCK, pos)
            if not block:
                return  # the file shrank since it was opened
            search = len(buf)
            buf += block
            pos += len(block)
            start = 0
            while (end := buf.find(b"\n", search)) >= 0:
                yield (None if skipping else bytes(buf[start:end])), origin + end + 1
                skipping = False
                start = search = end + 1
                if budget and origin + start - offset >= budget and origin + start < self.size:
                    self.stopped = True
                    return
            del buf[:start]
            origin += start
            if max_line and len(buf) > max_line:
                skipping = True
                origin += len(buf)
                del buf[:]


def read_transcript(reader: TranscriptReader, previous: TailState | None,
                    chunking: tuple[int, int, str], *, max_bytes: int = 0) -> Transcript:
    """The messages not indexed yet: from `previous` when the file only grew, else from the start.

    The new samples come from the bytes read anyway (the previous tail sample, verified, and the
    lines consumed now), so a tail read costs the appended bytes plus at most two samples.
    `max_bytes` (0: none) bounds one line and the lines one read takes (`complete` False: more to read).
    """
    before = _verified_tail(reader, previous) if previous is not None and previous.chunking == chunking else None
    if previous is not None and before is not None:
        offset, line_no, header, malformed = previous.offset, previous.lines, previous.header_date, previous.malformed
        head: bytearray | None = bytearray(before) if previous.offset < SAMPLE_BYTES else None
        tail = bytearray(before)
    else:
        offset, line_no, header, malformed = 0, 0, None, 0
        head, tail = bytearray(), bytearray()
    whole = before is None
    messages: list[Message] = []
    bad: list[int] = []
    oversized: list[int] = []
    for raw, end in reader.lines(offset, max_line=max_bytes, budget=max_bytes):
        line_no += 1
        if raw is None:  # its bytes were dropped: the samples take theirs from the file, a few KB
            oversized.append(line_no)
            start, offset = offset, end
            if head is not None and len(head) < SAMPLE_BYTES:
                head += reader.pread(SAMPLE_BYTES - len(head), start)
            n = min(SAMPLE_BYTES, end - start)
            tail += reader.pread(n, end - n)
            del tail[:-SAMPLE_BYTES]
            continue
        offset = end
        consumed = raw + b"\n"
        if head is not None and len(head) < SAMPLE_BYTES:
            head += consumed[:SAMPLE_BYTES - len(head)]
        tail += consumed[-SAMPLE_BYTES:]
        del tail[:-SAMPLE_BYTES]
        parsed = _parse_line(raw)
        if parsed is None:
            bad.append(line_no)
            continue
        kind, obj = parsed
        if kind == "session":
            header = header or _date_of(obj.get("timestamp"))
        elif kind == "message":
            found = _message(obj, line_no, header)
            if found is _MALFORMED:
                bad.append(line_no)
            elif isinstance(found, Message):
                messages.append(found)
    head_hash = _hash(bytes(head)) if head is not None else previous.head if previous is not None else ""
    carry = previous.carry if previous is not None and not whole else ()
    state = TailState(offset, line_no, head_hash, _hash(bytes(tail)), header, malformed + len(bad), chunking, carry)
    rewindow_from = None
    if messages and carry:  # with nothing new, the last chunks stay as they are
        messages[:0] = carry
        rewindow_from = carry[0].line
    return Transcript(messages, state, whole, bad, reader.bytes_read, rewindow_from, oversized, not reader.stopped)


def _verified_tail(reader: TranscriptReader, previous: TailState) -> bytes | None:
    """The bytes just before the previous offset if the file still starts with what was indexed, else None.

    The file must be no shorter, and its first bytes and the bytes before the offset must hash as
    they did (both samples cover the whole prefix when it is short).
    """
    if reader.size < previous.offset:
        return None
    n = min(previous.offset, SAMPLE_BYTES)
    before = reader.pread(n, previous.offset - n)
    if len(before) != n or _hash(before) != previous.tail:
        return None
    if previous.offset > n and _hash(reader.pread(n, 0)) != previous.head:
        return None
    return before


def describe_malformed(lines: Sequence[int]) -> str:
    """A report line for skipped transcript lines: how many, and the first few line numbers."""
    shown = ", ".join(map(str, lines[:_MALFORMED_SHOWN])) + (", ..." if len(lines) > _MALFORMED_SHOWN else "")
    return f"{len(lines)} malformed transcript line{'s' if len(lines) != 1 else ''} skipped (line {shown})"


def describe_oversized(lines: Sequence[int], max_bytes: int) -> str:
    """A report line for transcript lines too long to read: how many, which, and the setting that bounds them."""
    shown = ", ".join(map(str, lines[:_MALFORMED_SHOWN])) + (", ..." if len(lines) > _MALFORMED_SHOWN else "")
    return (f"{len(lines)} transcript line{'s' if len(lines) != 1 else ''} larger than max_file_bytes"
            f" ({max_bytes:,} bytes) skipped (line {shown}); raise max_file_bytes (0: no limit) to index them")


# -- parsing ----------------------------------------------------------------------------------

class _Malformed:
    """What `_message` returns for a line of the wrong shape (counted, not indexed)."""


_MALFORMED = _Malformed()


def _parse_line(raw: bytes) -> tuple[str, dict[str, Any]] | None:
    """(type, object) of one line, ("", {}) for a blank line, None when it is not a transcript line."""
    if not raw.strip():
        return "", {}
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    return obj["type"], obj


def _message(obj: dict[str, Any], line: int, header: str | None) -> Message | _Malformed | None:
    """The message on a `message` line; None for a role not indexed or no text, _MALFORMED for a wrong shape."""
    body = obj.get("message")
    if not isinstance(body, dict) or not isinstance(body.get("role"), str):
        return _MALFORMED
    content = body.get("content")
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = [part if isinstance(part, str) else part["text"] for part in content
                 if isinstance(part, str)
                 or (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str))]
    else:
        return _MALFORMED
    speaker = _ROLES.get(body["role"])
    text = storable("\n".join(t.strip("\n") for t in texts if t.strip()))
    if speaker is None or not text:
        return None
    date = _date_of(obj.get("timestamp")) or _date_of(body.get("timestamp")) or header
    return Message(line, speaker, text, date)


def _date_of(value: object) -> str | None:
    """The UTC date of an ISO timestamp or epoch seconds/milliseconds, None if it is neither."""
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            seconds = value / 1000 if abs(value) > _MS_THRESHOLD else value
            if not math.isfinite(seconds):
                return None
            return dt.datetime.fromtimestamp(seconds, dt.UTC).date().isoformat()
        if isinstance(value, str) and value.strip():
            stamp = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
            if stamp.tzinfo is not None:
                stamp = stamp.astimezone(dt.UTC)
            return stamp.date().isoformat()
    except (ValueError, OverflowError, OSError):
        return None
    return None


# -- chunking ---------------------------------------------------------------------------------


def chunk_messages(messages: Sequence[Message], *, max_tokens: int = 400, overlap: int = 80,
                   tokenizer: str = "cl100k_base") -> list[SessionChunk]:
    """Messages -> chunks of at most `max_tokens`, with JSONL line ranges and the first message's date.

    The rendered lines are chunked as Markdown lines are (`chunk_lines`), a message start being
    the preferred break; each rendered line remembers its message, which gives the chunk's lines.
    """
    from clawmem_index.text.tokens import get_encoding

    lines: list[str] = []
    owner: list[int] = []
    prio: list[int] = []
    for n, message in enumerate(messages):
        rendered = split_lines(f"{message.role}: {message.text}")
        lines.extend(rendered)
        owner.extend([n] * len(rendered))
        prio.extend([HEADING] + [LINE] * (len(rendered) - 1))
    chunks = chunk_lines(lines, max_tokens=max_tokens, overlap=overlap, encoding=get_encoding(tokenizer),
                         priorities=lambda _: list(prio))
    out: list[SessionChunk] = []
    for chunk in chunks:
        first, last = owner[chunk.start_line - 1], owner[chunk.end_line - 1]
        opens = first if prio[chunk.start_line - 1] == HEADING else None
        out.append(SessionChunk(messages[first].line, messages[last].line, chunk.text, chunk.hash,
                                messages[first].date, opens))
    return out


def chunk_transcript(transcript: Transcript, *, max_tokens: int = 400, overlap: int = 80,
                     tokenizer: str = "cl100k_base") -> tuple[list[SessionChunk], TailState]:
    """The chunks of a read's messages, and the state to keep: it carries what the next append re-windows."""
    if not transcript.messages:
        return [], transcript.state
    chunks = chunk_messages(transcript.messages, max_tokens=max_tokens, overlap=overlap, tokenizer=tokenizer)
    start = next((c.opens for c in reversed(chunks) if c.opens is not None), None)
    carry = tuple(transcript.messages[start:]) if start is not None else ()
    if sum(len(m.text) for m in carry) > CARRY_CHARS:
        carry = ()
    return chunks, dataclasses.replace(transcript.state, carry=carry)


def _hash(data: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(data)
