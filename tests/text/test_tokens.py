from __future__ import annotations

import marshal
from collections.abc import Iterator
from pathlib import Path

import pytest
import tiktoken
import xxhash
from tiktoken_ext import openai_public

from clawmem_index.text import tokens
from clawmem_index.text.tokens import get_encoding

SAMPLE = "Deploys go through staging first. 部署 <|endoftext|> naïve café 🚀\n\tindented"


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """cl100k_base as tiktoken builds it from its BPE file (seeded offline), no kept file involved."""
    tokens._seed_cache("cl100k_base")
    return tiktoken.Encoding(**openai_public.ENCODING_CONSTRUCTORS["cl100k_base"]())


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where the parsed tokenizer is kept (clawmem's cache), with a tiktoken cache of the test's own,
    and `get_encoding` loading afresh."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    get_encoding.cache_clear()
    yield tmp_path / "cache" / "clawmem" / "tokenizers"
    get_encoding.cache_clear()


def kept_file(folder: Path) -> Path:
    (path,) = folder.glob("cl100k_base-*.marshal")
    return path


def calls_to_constructor(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each parse of a BPE file by tiktoken's constructors, by file name."""
    calls: list[str] = []
    real = openai_public.load_tiktoken_bpe

    def counted(url: str, *args: object, **kwargs: object) -> dict[bytes, int]:
        calls.append(url.rsplit("/", 1)[-1].removesuffix(".tiktoken"))
        return real(url, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", counted)
    return calls


def same(encoding: tiktoken.Encoding, reference: tiktoken.Encoding) -> bool:
    return (encoding.encode(SAMPLE, allowed_special="all") == reference.encode(SAMPLE, allowed_special="all")
            and encoding.n_vocab == reference.n_vocab)


def test_a_parsed_tokenizer_is_kept_and_the_next_load_reads_it(cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                reference: tiktoken.Encoding) -> None:
    calls = calls_to_constructor(monkeypatch)
    assert same(get_encoding("cl100k_base"), reference)
    assert calls == ["cl100k_base"]
    assert kept_file(cache_dir).stat().st_size > 1_000_000

    get_encoding.cache_clear()  # as a new process would
    assert same(get_encoding("cl100k_base"), reference)
    assert calls == ["cl100k_base"]  # the BPE file was not parsed again


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "empty", "not marshal"])
def test_a_damaged_kept_tokenizer_is_made_again(cache_dir: Path, monkeypatch: pytest.MonkeyPatch, damage: str,
                                                 reference: tiktoken.Encoding) -> None:
    get_encoding("cl100k_base")
    path = kept_file(cache_dir)
    data = bytearray(path.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        del data[len(data) // 2:]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"\0" * 8 + b"not a marshal stream")
    path.write_bytes(bytes(data))
    calls = calls_to_constructor(monkeypatch)
    get_encoding.cache_clear()
    assert same(get_encoding("cl100k_base"), reference)
    assert calls == ["cl100k_base"]
    assert tokens._read_kept(path) is not None  # written again, whole


@pytest.mark.parametrize("args", [
    {"name": "cl100k_base", "pat_str": "(", "mergeable_ranks": {b"a": 0}, "special_tokens": {}},  # a bad pattern
    {"name": "cl100k_base", "pat_str": ".", "mergeable_ranks": [1, 2], "special_tokens": {}},
    {"name": 7, "pat_str": None, "mergeable_ranks": {}, "special_tokens": None},
])
def test_a_kept_file_that_is_whole_but_no_encoding_is_made_again(cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  reference: tiktoken.Encoding,
                                                                  args: dict[str, object]) -> None:
    get_encoding("cl100k_base")
    payload = marshal.dumps(args)
    kept_file(cache_dir).write_bytes(xxhash.xxh3_64_digest(payload) + payload)
    calls = calls_to_constructor(monkeypatch)
    get_encoding.cache_clear()
    assert same(get_encoding("cl100k_base"), reference)
    assert calls == ["cl100k_base"]


def test_a_folder_that_cannot_take_the_kept_file_only_costs_the_parse(
        cache_dir: Path, monkeypatch: pytest.MonkeyPatch, reference: tiktoken.Encoding) -> None:
    def refuse(self: Path, data: bytes) -> int:
        raise PermissionError(13, "read-only")

    calls = calls_to_constructor(monkeypatch)
    get_encoding("cl100k_base")  # seeds the BPE file first
    get_encoding.cache_clear()
    kept_file(cache_dir).unlink()
    monkeypatch.setattr(Path, "write_bytes", refuse)
    assert same(get_encoding("cl100k_base"), reference)
    assert calls == ["cl100k_base", "cl100k_base"]
    assert list(cache_dir.glob("*")) == []  # no temporary file left behind
