"""Read and chunk the files a sync found changed: in worker processes when there is enough to do.

Chunking is CPU-bound pure Python: a cold index of thousands of files is worth other cores, so that
the writer (clawmem_index.engine.sync) only writes. A transcript (source "sessions") is read here too, from
where the last sync stopped when it only grew (`clawmem_index.sources.sessions`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from clawmem_index.config import Settings
from clawmem_index.errors import PathError
from clawmem_index.index.store import FileRow
from clawmem_index.sources.files import open_beneath, read_all, refusal_of
from clawmem_index.sources.paths import reads_annotations
from clawmem_index.sources.sessions import (
    SessionChunk,
    TailState,
    Transcript,
    TranscriptReader,
    chunk_transcript,
    read_transcript,
)
from clawmem_index.sources.workspace import MemoryFile, size_reason
from clawmem_index.text.annotations import Annotations, entry_spans, read_annotations, strip_annotations
from clawmem_index.text.chunking import Chunk, chunk_markdown, chunk_spans
from clawmem_index.text.keywords import index_text

__all__ = ["ParsedFile", "ParsedSession", "Progress", "parse_all", "parse_session"]

Progress = Callable[[int, int], None]  # (done, total): a pass's files, or its vectors

# Below, workers would save 10-20% at twice to three times the memory (docs/benchmarks.md).
PARALLEL_MIN_BYTES = 12 << 20
PARSE_BATCH = 32  # files per task sent to a chunking worker
# OpenClaw's curated files, cut into one chunk per entry as memory-core cuts them: an entry's importance and
# repositories weigh that entry alone, and a hit is the entry. (memory.md, which OpenClaw never injects, is not.)
PER_ENTRY = frozenset({"MEMORY.md", "USER.md"})
ANNOTATED_KEY = "annotations-1"  # in the key of a chunk that holds annotations (see `_annotated`)
PARSE_AHEAD = 16  # batches in flight per worker: enough to keep them busy, few enough to bound memory


@dataclass(frozen=True)
class ParsedFile:
    file: MemoryFile
    hash: str
    chunks: list[Chunk]
    size: int
    error: str | None = None
    refused: bool = False  # may not be read (now a symlink, FIFO...): `error` says why, None if it is just gone
    fts_texts: list[str] = field(default_factory=list)  # each chunk's text as the keyword index takes it
    terms: list[Any] | None = None  # the store's `terms_of` each of those (None: the store has none)
    annotations: list[Annotations] = field(default_factory=list)  # each chunk's (OpenClaw's entry metadata)


@dataclass(frozen=True)
class ParsedSession:
    """A transcript's new messages (or all of them, `transcript.whole`) as chunks, or why it was not read."""

    file: MemoryFile
    transcript: Transcript | None
    chunks: list[SessionChunk]
    error: str | None = None
    refused: bool = False
    max_bytes: int = 0  # the bound its read had (for the report)


def parse_all(files: Sequence[MemoryFile], settings: Settings, indexed: dict[str, FileRow],
              terms_of: Callable[[str], Any] | None) -> Iterator[ParsedFile]:
    """Each file read and chunked, with what the keyword index makes of each chunk: in worker processes
    when there is enough to do, so that the writer only writes."""
    args = _ParseArgs(settings.chunking.tokens, settings.chunking.overlap, settings.chunking.tokenizer,
                      settings.refuse_hardlinks, terms_of, settings.max_file_bytes)
    total = sum(f.size for f in files)
    workers = min(os.cpu_count() or 1, 8)
    if workers > 1 and total >= PARALLEL_MIN_BYTES and len(files) >= 64:
        # Chunking is CPU-bound pure Python: a cold index of thousands of files is worth other cores.
        # "spawn" because the daemon has threads, which do not survive a fork safely.
        from collections import deque
        from concurrent.futures import Future, ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_warm_up,
                                 initargs=(settings.chunking.tokenizer,)) as pool:
            # A bounded window of batches in flight (not `map`, which submits every file at once and
            # keeps every parsed file the writer has not taken yet): memory stays flat in the file count.
            ahead: deque[Future[list[ParsedFile]]] = deque()
            for start in range(0, len(files), PARSE_BATCH):
                batch = files[start:start + PARSE_BATCH]
                ahead.append(pool.submit(_parse_batch, batch, args, [indexed.get(f.path) for f in batch]))
                if len(ahead) >= workers * PARSE_AHEAD:
                    yield from ahead.popleft().result()
            while ahead:
                yield from ahead.popleft().result()
        return
    for f in files:
        yield _parse_one(f, args, indexed.get(f.path))


@dataclass(frozen=True)
class _ParseArgs:
    max_tokens: int
    overlap: int
    tokenizer: str
    refuse_hardlinks: bool
    terms_of: Callable[[str], Any] | None  # a module-level function: it travels to the workers by name
    max_bytes: int = 0  # a file grown past this since the scan is not read (0: no limit)


def _parse_batch(files: Sequence[MemoryFile], args: _ParseArgs,
                 previous: Sequence[FileRow | None]) -> list[ParsedFile]:
    return [_parse_one(f, args, row) for f, row in zip(files, previous, strict=True)]


def _warm_up(tokenizer: str) -> None:
    """Load the tokenizer and parser while the parent is still scanning."""
    chunk_markdown("# warm\n- up", tokenizer=tokenizer)


def _parse_one(f: MemoryFile, args: _ParseArgs, previous: FileRow | None) -> ParsedFile:
    """Read one file through a descriptor opened beneath its root, and keep the stat of what was read."""
    try:
        with open_beneath(f.root, f.names, display=f.path, refuse_hardlinks=args.refuse_hardlinks) as opened:
            if args.max_bytes and opened.stat.st_size > args.max_bytes:
                return ParsedFile(f, "", [], 0, error=size_reason(opened.stat.st_size, args.max_bytes), refused=True)
            data = read_all(opened.fd)
            f = f.as_read(opened.stat)
    except PathError as exc:
        why = refusal_of(exc)
        if why is not None and why.missing:
            return ParsedFile(f, "", [], 0, refused=True)  # gone since the scan: just unindex it
        return ParsedFile(f, "", [], 0, error=why.reason if why else str(exc), refused=True)
    except OSError as exc:
        return ParsedFile(f, "", [], 0, error=f"cannot read: {exc.strerror or exc}")
    digest = xxhash.xxh3_128_hexdigest(data)
    if previous is not None and previous.hash == digest:
        return ParsedFile(f, digest, [], len(data))
    text = data.decode("utf-8", errors="replace")
    if f.path in PER_ENTRY and f.source == "memory":  # as memory-core: each entry a chunk (its annotations its own)
        chunks = chunk_spans(text, entry_spans(text), max_tokens=args.max_tokens, overlap=args.overlap,
                             tokenizer=args.tokenizer)
    else:
        chunks = chunk_markdown(text, max_tokens=args.max_tokens, overlap=args.overlap, tokenizer=args.tokenizer)
    if "<!--" in text:
        chunks = [_annotated(chunk) for chunk in chunks]
    # An annotation is the entry's metadata, not its words: the keyword index never sees it.
    fts_texts = [index_text(strip_annotations(chunk.text)) for chunk in chunks]
    terms = None if args.terms_of is None else [args.terms_of(t) for t in fts_texts]
    return ParsedFile(f, digest, chunks, len(data), fts_texts=fts_texts, terms=terms,
                      annotations=_annotations(f.path, chunks) if "<!--" in text else [])


def _annotated(chunk: Chunk) -> Chunk:
    """A chunk holding annotations, keyed apart from the same text read by an older clawmem: its vector is made
    of its words alone (`embedding_text`), so neither a rebuild's carry nor the embedding cache may hand it the
    vector of the text with its comments. Its text, and so an edit of an annotation, still changes the key."""
    if strip_annotations(chunk.text) == chunk.text:
        return chunk
    digest = xxhash.xxh3_128_hexdigest(f"{chunk.text}\0{ANNOTATED_KEY}".encode("utf-8", "surrogatepass"))
    return replace(chunk, hash=digest)


def _annotations(key: str, chunks: Sequence[Chunk]) -> list[Annotations]:
    """Each chunk's annotations, as its file may carry them (empty: none carries any)."""
    curated, project_scoped = reads_annotations(key)
    found = [read_annotations(c.text.split("\n"), curated=curated, project_scoped=project_scoped) for c in chunks]
    return found if any(found) else []


def parse_session(f: MemoryFile, settings: Settings, previous: FileRow | None) -> ParsedSession:
    """Read a transcript's new lines (all of them when it is not a pure append) through a counting reader."""
    chunking = settings.chunking
    params = (chunking.tokens, chunking.overlap, chunking.tokenizer)
    state = TailState.from_json(previous.state) if previous is not None and previous.source == "sessions" else None
    try:
        with open_beneath(f.root, f.names, display=f.path, refuse_hardlinks=settings.refuse_hardlinks) as opened:
            transcript = read_transcript(TranscriptReader(opened.fd, opened.stat.st_size), state, params,
                                         max_bytes=settings.max_file_bytes)
            f = f.as_read(opened.stat)
    except PathError as exc:
        why = refusal_of(exc)
        if why is not None and why.missing:
            return ParsedSession(f, None, [], refused=True)
        return ParsedSession(f, None, [], error=why.reason if why else str(exc), refused=True)
    except OSError as exc:
        return ParsedSession(f, None, [], error=f"cannot read: {exc.strerror or exc}")
    chunks, state = chunk_transcript(transcript, max_tokens=chunking.tokens, overlap=chunking.overlap,
                                     tokenizer=chunking.tokenizer)
    return ParsedSession(f, replace(transcript, state=state), chunks, max_bytes=settings.max_file_bytes)
