"""Every provider derives from `ProviderBase`: what a provider may do beyond embedding (a preferred batch, the
vendor's own endpoint, loading, warming, closing) is asked of each the same way, never probed for."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import clawmem_index
from clawmem_index.embeddings.base import EmbeddingProvider, ProviderBase
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.embeddings.gemini import GeminiProvider
from clawmem_index.embeddings.isolated import IsolatedProvider
from clawmem_index.embeddings.local import LocalProvider
from clawmem_index.embeddings.openai import OpenAIProvider
from clawmem_index.embeddings.voyage import VoyageProvider

PACKAGE = Path(clawmem_index.__file__).parent
OPTIONAL = ("preferred_batch", "official_endpoint", "closed", "load", "warm", "close")


@pytest.mark.parametrize("kind", [FakeProvider, LocalProvider, IsolatedProvider, OpenAIProvider, GeminiProvider,
                                  VoyageProvider])
def test_every_provider_derives_from_the_base(kind: type) -> None:
    assert issubclass(kind, ProviderBase)
    assert all(hasattr(kind, name) for name in OPTIONAL)


def test_the_base_is_a_provider_that_does_none_of_it() -> None:
    provider = FakeProvider()
    assert isinstance(provider, EmbeddingProvider)
    assert (provider.preferred_batch, provider.official_endpoint, provider.closed) == (None, False, False)
    provider.load(), provider.warm(), provider.close()  # nothing to do, and nothing raised
    assert provider.embed_query("still answers") and not provider.closed


def test_the_isolated_model_keeps_the_batch_it_was_given() -> None:
    info = FakeProvider().info
    assert IsolatedProvider(info, FakeProvider, preferred_batch=48).preferred_batch == 48
    assert IsolatedProvider(info, FakeProvider).preferred_batch is None


def test_nothing_probes_a_provider_for_what_the_base_gives() -> None:
    probes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 \
                    and "provider" in ast.unparse(node.args[0]) \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in OPTIONAL:
                probes.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert probes == [], probes
