"""Local embedding throughput: tokens/s and chunk embeddings/s of the llama.cpp provider.

    python bench/bench_embeddings.py [--model PATH.gguf ...] [--texts N]

Texts are real chunks: bench/generate.py notes cut by clawmem's chunker (~300 tokens each), plus
short sentences, so both long and short inputs are measured. Each model is measured with the
provider exactly as clawmem runs it (its batching, packing and threads); tokens are counted with the
model's own tokenizer. Default models: clawmem's default (MiniLM converted to f16 from installed
packages) and, when present, the shared q8_0 file beside the project.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from generate import generate  # noqa: E402

from clawmem_index.config import EmbeddingSettings, load_settings  # noqa: E402
from clawmem_index.embeddings.local import LocalProvider  # noqa: E402
from clawmem_index.embeddings.models import ensure_local_model  # noqa: E402
from clawmem_index.text.chunking import chunk_markdown  # noqa: E402


def sample_texts(n: int) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        ws = generate(Path(tmp) / "ws", max(4, n // 2))
        chunks = [c.text for p in sorted(ws.rglob("*.md")) for c in chunk_markdown(p.read_text())]
    long = chunks[:n]
    short = [line.strip("- ") for text in long for line in text.splitlines() if len(line) > 40][:n]
    return {"chunks": long, "sentences": short}


def measure(provider: LocalProvider, texts: list[str], repeats: int = 3) -> dict[str, Any]:
    tokens = sum(provider.count_tokens(t) for t in texts)
    provider.embed_documents(texts[:4])  # load and warm up
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        provider.embed_documents(texts)
        runs.append(time.perf_counter() - started)
    best, median = min(runs), statistics.median(runs)
    return {"texts": len(texts), "tokens": tokens, "avg_tokens": round(tokens / len(texts), 1),
            "tokens_per_s_best": round(tokens / best), "tokens_per_s_median": round(tokens / median),
            "texts_per_s_median": round(len(texts) / median, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="GGUF file (repeatable)")
    parser.add_argument("--texts", type=int, default=120)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "embeddings.json")
    args = parser.parse_args()
    settings = load_settings(overrides={"embedding.provider": "local"}, environ={})
    models = args.model or []
    if not models:
        models.append(str(ensure_local_model(settings.embedding, settings.cache_dir)))
        shared = ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2-q8_0.gguf"
        if shared.exists():
            models.append(str(shared))
    texts = sample_texts(args.texts)
    results: dict[str, Any] = {}
    for model in models:
        provider = LocalProvider(EmbeddingSettings(provider="local", local_model=model), Path(model))
        results[Path(model).name] = {name: measure(provider, batch) for name, batch in texts.items()}
        print(Path(model).name, json.dumps(results[Path(model).name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
