"""The `local` provider: a GGUF embedding model run in-process by llama-cpp-python.

llama_cpp is imported, and the model loaded, when the provider first tokenizes or embeds, not when
it is built: its identity (name, dimensions) is read from the GGUF header, so a command that embeds
nothing (status, a no-change sync, a keyword search) pays neither the import nor the ~100 MB model.

How the work reaches llama.cpp, and why (measured on 2 busy cores with all-MiniLM-L6-v2):
- One context of the model's trained length (capped at `MAX_CONTEXT`); n_batch = n_ubatch cover a
  whole context, since an encoder must see a whole sequence in one micro-batch.
- Flash attention on: about 30% more tokens/s on 300-500-token chunks, vectors unchanged (cosine
  0.9999999 against the plain path).
- One thread per core this process may use: 1 thread on 2 cores is 40% slower, 3 threads slower too.
- Texts are counted with the model's own tokenizer. A text over the window (`embedding.local_window`,
  capped by the context; by default 128 tokens for a MiniLM model, the whole context for any other)
  is cut on whitespace, at a line's end where one is near (inside a very long word, on characters),
  into pieces that fit, and its vector is the token-weighted mean of its pieces' vectors: nothing is
  truncated and nothing is sent to fail. The default model's window is shorter than its context
  because sentence-transformers' MiniLM models were trained on inputs of at most 128 tokens (the GGUF
  header records only the context, 512); other models keep their whole context, measured or not.
  Embedding 400-token chunks in 128-token windows instead of whole gave LoCoMo's hybrid search (the
  fusion unchanged) 0.873 recall@6 instead of 0.871 and MRR 0.767 instead of 0.759 (256-token
  windows: 0.867; 64: 0.871; SciFact nDCG@10 0.735 against 0.739; docs/benchmarks.md). The window
  and where it cuts are part of the provider's identity (`endpoint`), so changing either embeds
  again instead of mixing vectors.
- Pieces are sorted by length and packed into decode calls of at most `pack_tokens` tokens. Packing
  short texts saves per-call overhead, but llama.cpp attends over the whole packed batch (masked),
  so a pack costs more than the sum of its texts; 256 tokens was at or near the best measured.
- One lock guards the model, held per decode call: a search's query can slip in between the
  calls of a long indexing batch instead of waiting for all of it.
- verbose=False keeps llama.cpp quiet; note that llama-cpp-python then points the process's stdout
  and stderr at /dev/null for the moment a model loads: what another thread prints meanwhile is
  lost, so a search loads the model before its query's deadline starts (`load`).
- A process never exits under a llama.cpp call: C's exit() destroys ggml's static state while a
  compute thread still reads it, a SIGSEGV (exit 139) after the answer was printed (a query vector
  past its deadline, a Ctrl-C during `clawmem index`: those calls run on daemon threads). At exit
  (atexit, which runs before the interpreter's teardown) each loaded model's call in flight, one
  decode, tokenization or load, is waited for (at most EXIT_WAIT seconds) and no other is begun.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import ProviderBase, ProviderInfo
from clawmem_index.embeddings.batching import Piece, Plan, combine
from clawmem_index.embeddings.models import gguf_metadata, model_identity
from clawmem_index.errors import ProviderError

if TYPE_CHECKING:
    from llama_cpp import Llama

__all__ = ["DEFAULT_PACK_TOKENS", "EXIT_WAIT", "MAX_CONTEXT", "SHORT_INPUT_WINDOW", "LocalProvider"]

MAX_CONTEXT = 1024
"""Longer contexts are split instead: attention memory grows with the square of the context."""
DEFAULT_PACK_TOKENS = 256
SHORT_INPUT_WINDOW = 128
"""The window of a MiniLM model when `embedding.local_window` is 0: the input length it was trained on."""
EXIT_WAIT = 30.0
"""Seconds a process's exit waits for the llama.cpp call in flight: one decode of at most `pack_tokens`
tokens, a tokenization or a model load (0.1-0.7 s on 2 busy cores)."""
_SEGMENT = re.compile(r"\s*\S+\s*|\s+")
_MODELS: weakref.WeakSet[LocalProvider] = weakref.WeakSet()  # providers that may run llama.cpp


def _line_end(words: Sequence[tuple[str, int]], start: int, end: int, used: int, budget: int) -> int:
    """Where a piece filled with `words[start:end]` (`used` tokens) should end: after its last line break
    if that keeps at least half the budget, else at `end`.

    A window cut mid-line splits a sentence (a dialogue turn, a list item) between two vectors that
    each see half of it; ending windows at line breaks gave LoCoMo's hybrid search 0.878 recall@6
    instead of 0.876 (docs/benchmarks.md).
    """
    kept = used
    for cut in range(end, start + 1, -1):
        if kept < budget // 2:
            break
        if "\n" in words[cut - 1][0]:
            return cut
        kept -= words[cut - 1][1]
    return end


class LocalProvider(ProviderBase):
    """An `EmbeddingProvider` over one GGUF file; loads the model on first use.

    Raises ProviderError when the file cannot be loaded as an embedding model (when constructed if
    its header does not declare the vector size, else on first use).
    """

    def __init__(self, settings: EmbeddingSettings, model_path: Path, *, pack_tokens: int | None = None) -> None:
        self.model_path = Path(model_path)
        meta = gguf_metadata(self.model_path)
        arch = str(meta.get("general.architecture", ""))
        trained = int(meta.get(f"{arch}.context_length") or 512)
        self.n_ctx = min(trained, MAX_CONTEXT)
        name = str(meta.get("general.name") or self.model_path.stem)
        short_inputs = SHORT_INPUT_WINDOW if "minilm" in name.lower() else self.n_ctx
        self.window = min(self.n_ctx, settings.local_window or short_inputs)
        self.pack_tokens = pack_tokens or DEFAULT_PACK_TOKENS
        self._n_batch = max(self.pack_tokens, self.n_ctx)
        self.threads = settings.threads or _available_cpus()
        self.query_threads = min(self.threads, settings.query_threads or self.threads)
        self._max_seqs = max(1, settings.batch_size)
        self._lock = threading.Lock()  # around every llama.cpp call once loaded; taken before `_load_lock`
        self._load_lock = threading.Lock()
        self._exiting = False
        self._has_pooling = f"{arch}.pooling_type" in meta
        self._model: Llama | None = None
        self._special_count: int | None = None
        # llama.cpp's n_embd is this header field; a file without it is loaded now to ask.
        dims = int(meta.get(f"{arch}.embedding_length") or 0) or int(self._llama.n_embd())
        self._info = ProviderInfo(provider="local", model=name, dims=dims,
                                  endpoint=f"{model_identity(self.model_path)};window={self.window};cut=lines")

    @property
    def _llama(self) -> Llama:
        """The model, loaded on first use (under its own lock: callers may hold `_lock`)."""
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    _MODELS.add(self)
                    self._model = self._load(has_pooling=self._has_pooling)
        return self._model

    @contextlib.contextmanager
    def _native(self) -> Iterator[Llama]:
        """The model for one llama.cpp call, under `_lock`; refused once the process exits (`finish_for_exit`)."""
        with self._lock:
            if self._exiting:
                raise ProviderError("the process is exiting: the local model takes no more work")
            yield self._llama

    def finish_for_exit(self, deadline: float) -> bool:
        """Wait (until `time.monotonic()` reaches `deadline`) for the llama.cpp call in flight, and begin no other.

        Both locks stay held: a thread that wants the model waits until the process is gone, so C's
        exit() never runs under a computation. False if the call was still running at the deadline.
        """
        self._exiting = True
        for lock in (self._lock, self._load_lock):
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        _MODELS.discard(self)
        return True

    @property
    def _specials(self) -> int:
        """Tokens the model adds to every text (BOS/EOS)."""
        if self._special_count is None:
            with self._native() as llama:
                self._special_count = len(llama.tokenize(b"", add_bos=True, special=False))
        return self._special_count

    def load(self) -> None:
        """Load the model if it is not yet, and nothing more (no lock a decode holds is taken).

        QueryDeadline calls it on the caller's thread before its clock starts: the load points the
        process's stdout and stderr at /dev/null, and a search past its deadline printed its answer
        into that and exited 0 with nothing said.
        """
        self._llama  # noqa: B018

    def warm(self) -> None:
        """Load the model now (the daemon does, off the query path)."""
        self._specials  # noqa: B018

    @property
    def info(self) -> ProviderInfo:
        return self._info

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        pieces = [piece for index, text in enumerate(texts) for piece in self._pieces(text, index)]
        plan = Plan(tuple(pieces), self._packs(pieces), len(texts))
        vectors: dict[int, list[float]] = {}
        for pack in plan.batches:
            vectors.update(zip(pack, self._embed([pieces[i].text for i in pack]), strict=True))
        return combine(plan, [vectors[number] for number in range(len(pieces))])

    def embed_query(self, text: str) -> list[float]:
        """As a document (the same vector, bit for bit), on `query_threads` threads."""
        pieces = self._pieces(text, 0)
        plan = Plan(tuple(pieces), self._packs(pieces), 1)
        vectors: dict[int, list[float]] = {}
        for pack in plan.batches:
            vectors.update(zip(pack, self._embed([pieces[i].text for i in pack], threads=self.query_threads),
                               strict=True))
        vector: list[float] = combine(plan, [vectors[number] for number in range(len(pieces))])[0]
        return vector

    def count_tokens(self, text: str) -> int:
        """Tokens the model sees for `text`, its special tokens included."""
        with self._native() as llama:
            return len(llama.tokenize(text.encode("utf-8"), add_bos=True, special=False))

    def _load(self, *, has_pooling: bool) -> Llama:
        try:
            import llama_cpp
        except ImportError as exc:
            raise ProviderError(f"the local provider needs llama-cpp-python ({exc})") from exc
        # A GGUF without a pooling type (a generative model) would hand back one vector per token.
        pooling = llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if has_pooling else llama_cpp.LLAMA_POOLING_TYPE_MEAN
        try:
            return llama_cpp.Llama(
                model_path=str(self.model_path), embedding=True, n_ctx=self.n_ctx, n_batch=self._n_batch,
                n_ubatch=self._n_batch, n_threads=self.threads, n_threads_batch=self.threads,
                pooling_type=pooling, flash_attn=True, verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ProviderError(f"cannot load {self.model_path} as an embedding model: {exc}") from exc

    def _pieces(self, text: str, index: int) -> list[Piece]:
        count = self.count_tokens(text)
        if count <= self.window:
            return [Piece(text, count, index)]
        return [Piece(part, tokens, index) for part, tokens in self._split(text)]

    def _split(self, text: str) -> list[tuple[str, int]]:
        """Cut an over-long text into consecutive substrings that each fit the window.

        Whitespace-separated words tokenize independently under WordPiece, so per-word counts add
        up; each piece is still re-counted whole and shortened if another tokenizer disagrees. A
        piece ends at a line's end when one falls in its second half (`_line_end`).
        """
        budget = self.window - self._specials
        words: list[tuple[str, int]] = []
        for word in _SEGMENT.findall(text):
            tokens = self._count_bare(word)
            words.extend(self._cut_word(word, tokens) if tokens > budget else [(word, tokens)])
        pieces: list[tuple[str, int]] = []
        start = 0
        while start < len(words):
            end, used = start, 0
            while end < len(words) and (end == start or used + words[end][1] <= budget):
                used += words[end][1]
                end += 1
            if end < len(words):
                end = _line_end(words, start, end, used, budget)
            while True:
                piece = "".join(w for w, _ in words[start:end])
                count = self.count_tokens(piece)
                if count <= self.window or end - start == 1:
                    break
                end -= 1
            pieces.append((piece, count))
            start = end
        return pieces

    def _cut_word(self, word: str, tokens: int) -> list[tuple[str, int]]:
        """A single run of characters longer than the context (a hash, base64...), cut by characters.

        Slices are sized from the word's characters per token and shrunk in proportion while they
        overflow: two or three tokenizer calls per piece rather than a search over the whole word.
        """
        budget = self.window - self._specials
        chars_per_token = len(word) / max(tokens, 1)
        parts: list[tuple[str, int]] = []
        while word:
            size = min(len(word), max(1, int(budget * chars_per_token)))
            count = self._count_bare(word[:size])
            while count > budget and size > 1:
                size = max(1, min(size - 1, size * budget // count))
                count = self._count_bare(word[:size])
            parts.append((word[:size], count))
            word = word[size:]
        return parts

    def _count_bare(self, text: str) -> int:
        with self._native() as llama:
            return len(llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _packs(self, pieces: Sequence[Piece]) -> tuple[tuple[int, ...], ...]:
        """Piece numbers grouped into decode calls of at most `pack_tokens` tokens, longest first."""
        order = sorted(range(len(pieces)), key=lambda i: -pieces[i].tokens)
        packs: list[tuple[int, ...]] = []
        current: list[int] = []
        used = 0
        for number in order:
            tokens = pieces[number].tokens
            if current and (used + tokens > self.pack_tokens or len(current) >= self._max_seqs):
                packs.append(tuple(current))
                current, used = [], 0
            current.append(number)
            used += tokens
        if current:
            packs.append(tuple(current))
        return tuple(packs)

    def _embed(self, texts: list[str], *, threads: int | None = None) -> list[list[float]]:
        """One llama.cpp decode for `texts`, which fit one micro-batch together (on `threads` threads, if given)."""
        try:
            with self._native() as llama:
                if threads is None or threads == self.threads:
                    raw: Any = llama.embed(texts, normalize=False, truncate=False)
                else:
                    raw = self._embed_on(llama, threads, texts)
        except (ValueError, RuntimeError) as exc:
            raise ProviderError(f"local embedding failed ({self.model_path.name}): {exc}") from exc
        if len(raw) != len(texts):
            raise ProviderError(f"llama.cpp returned {len(raw)} vectors for {len(texts)} texts")
        return [list(map(float, vector)) for vector in raw]

    def _embed_on(self, llama: Llama, threads: int, texts: list[str]) -> Any:
        """`embed` with the context's thread count set for this decode only (the caller holds `_lock`)."""
        import llama_cpp

        llama_cpp.llama_set_n_threads(llama.ctx, threads, threads)
        try:
            return llama.embed(texts, normalize=False, truncate=False)
        finally:
            llama_cpp.llama_set_n_threads(llama.ctx, self.threads, self.threads)


@atexit.register
def _finish_native_work() -> None:
    """Let the llama.cpp calls in flight end before the process does (see the module's docstring).

    atexit runs before the interpreter's teardown, while the daemon threads that make those calls
    (a query past its deadline, an indexing pass a Ctrl-C stopped) still run.
    """
    deadline = time.monotonic() + EXIT_WAIT
    for provider in list(_MODELS):
        provider.finish_for_exit(deadline)


def _available_cpus() -> int:
    """Cores this process may run on (respects affinity and cpusets), which can be fewer than os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
