"""Loading Hugging Face checkpoint directories: configs, sharded weights, bad input, tokenizer."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import hf_checkpoint as hfc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

SMALL = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Qwen2 checkpoint (biases exercise the optional tensors), in one file and sharded."""
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL))
    one = str(tmp_path_factory.mktemp("one"))
    model.save_pretrained(one)
    sharded = str(tmp_path_factory.mktemp("sharded"))
    model.save_pretrained(sharded, max_shard_size="20KB")
    return one, sharded


def _copy(src: str, dst) -> str:
    dst = str(dst)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def _edit_config(path: str, **changes) -> None:
    file = os.path.join(path, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(file, "w") as f:
        json.dump(cfg, f)


def _rewrite_weights(path: str, edit) -> str:
    file = os.path.join(path, "model.safetensors")
    tensors = safetensors_torch.load_file(file)
    edit(tensors)
    safetensors_torch.save_file(tensors, file, metadata={"format": "pt"})
    return file


def test_sharded_checkpoint_loads_the_same_parameters(saved):
    one, sharded = saved
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(sharded) if f.endswith(".safetensors")]) > 2
    a, b = hfc.load_checkpoint(one), hfc.load_checkpoint(sharded)
    assert a.config == b.config
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(x, y)
    # the biases of Qwen2 came from the file, not from an initialiser
    want = safetensors_torch.load_file(os.path.join(one, "model.safetensors"))
    np.testing.assert_array_equal(a.params["blocks"][1]["attn"]["k_proj"]["bias"][...],
                                  want["model.layers.1.self_attn.k_proj.bias"].numpy())
    np.testing.assert_array_equal(a.params["blocks"][0]["mlp"]["down"]["kernel"][...],
                                  want["model.layers.0.mlp.down_proj.weight"].numpy().T)


def test_old_and_new_config_schemas_agree():
    """rope_theta + rope_scaling (with the older "type" key) = the newer rope_parameters."""
    base = dict(model_type="llama", **SMALL)
    old = hfc.config_from_hf({**base, "rope_theta": 5e5, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}})
    new = hfc.config_from_hf({**base, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
        "original_max_position_embeddings": 32}})
    assert old == new and old.rope.kind == "yarn" and old.rope.theta == 5e5
    plain = hfc.config_from_hf(base)
    assert plain.rope.kind == "default" and plain.rope.theta == 1e4


def test_windows_from_configs():
    base = {**SMALL, "num_hidden_layers": 4}
    qwen = hfc.config_from_hf({**base, "model_type": "qwen2", "use_sliding_window": True,
                               "sliding_window": 8, "max_window_layers": 2})
    assert qwen.layer_windows == (None, None, 8, 8)
    assert hfc.config_from_hf({**base, "model_type": "qwen2", "sliding_window": 8,
                               "max_window_layers": 2}).layer_windows is None
    assert hfc.config_from_hf({**base, "model_type": "mistral",
                               "sliding_window": 6}).layer_windows == (6,) * 4
    typed = hfc.config_from_hf({**base, "model_type": "qwen2", "sliding_window": 5,
                                "layer_types": ["full_attention", "sliding_attention"] * 2})
    assert typed.layer_windows == (None, 5, None, 5)


@pytest.mark.parametrize("changes,match", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "rope_parameters": None},
     "rope type 'dynamic' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     "rope type 'longrope' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"num_attention_heads": 3}, "num_heads=3 is not a multiple"),
    ({"hidden_size": "64"}, "hidden_size must be a positive integer"),
])
def test_bad_configs_are_refused_naming_the_file(saved, tmp_path, changes, match):
    path = _copy(saved[0], tmp_path / "ck")
    _edit_config(path, **changes)
    with pytest.raises(ValueError, match=match) as e:
        hfc.load_checkpoint(path)
    assert str(e.value).startswith(os.path.join(path, "config.json"))
    assert "\n" not in str(e.value)


def test_missing_files_are_refused(saved, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"config.json: no such file"):
        hfc.load_checkpoint(str(empty))
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        hfc.load_checkpoint(str(tmp_path / "nowhere"))
    no_weights = _copy(saved[0], tmp_path / "no_weights")
    os.remove(os.path.join(no_weights, "model.safetensors"))
    with pytest.raises(ValueError, match=r"no \*\.safetensors weights"):
        hfc.load_checkpoint(no_weights)
    lost_shard = _copy(saved[1], tmp_path / "lost_shard")
    victim = sorted(f for f in os.listdir(lost_shard) if f.endswith(".safetensors"))[1]
    os.remove(os.path.join(lost_shard, victim))
    with pytest.raises(ValueError, match=f"shard {victim} does not exist"):
        hfc.load_checkpoint(lost_shard)
    corrupt = _copy(saved[0], tmp_path / "corrupt")
    with open(os.path.join(corrupt, "model.safetensors"), "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        hfc.load_checkpoint(corrupt)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
     "tensor model.layers.1.mlp.up_proj.weight is missing"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 31)}),
     r"tensor model.layers.0.self_attn.q_proj.weight has shape \(32, 31\), expected \(32, 32\)"),
    (lambda t: t.update({"model.norm.weight": torch.ones(32, dtype=torch.int32)}),
     "tensor model.norm.weight has dtype I32"),
    (lambda t: t.update({"model.layers.0.mlp.gate_proj.bias": torch.zeros(48)}),
     "tensor model.layers.0.mlp.gate_proj.bias is not used"),
])
def test_bad_tensors_are_refused_naming_file_and_tensor(saved, tmp_path, edit, match):
    path = _copy(saved[0], tmp_path / "ck")
    file = _rewrite_weights(path, edit)
    with pytest.raises(ValueError, match=match) as e:
        hfc.load_checkpoint(path)
    assert "\n" not in str(e.value)
    if "missing" not in match:
        assert str(e.value).startswith(file)


def test_dtypes_and_memory_the_machine_cannot_hold(saved):
    with pytest.raises(ValueError, match="dtype float64"):
        hfc.load_checkpoint(saved[0], dtype="float64")
    with pytest.raises(ValueError, match="dtype int8"):
        hfc.load_checkpoint(saved[0], dtype=jnp.int8)
    with pytest.raises(ValueError, match=r"need 0.00 GiB as bfloat16, more than the "
                                         "memory_limit_bytes"):
        hfc.load_checkpoint(saved[0], dtype="bfloat16", memory_limit_bytes=1000)
    ck = hfc.load_checkpoint(saved[0], dtype="bfloat16")
    n = sum(x.size for x in jax.tree.leaves(ck.params))
    hfc.load_checkpoint(saved[0], dtype="bfloat16", memory_limit_bytes=2 * n)  # fits exactly


def test_tied_embeddings_ignore_a_saved_head(tmp_path):
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(**SMALL, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg)
    path = str(tmp_path / "tied")
    model.save_pretrained(path)
    _rewrite_weights(path, lambda t: t.update({
        "lm_head.weight": t["model.embed_tokens.weight"].clone(),
        "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}))
    ck = hfc.load_checkpoint(path)
    assert ck.config.tie_embeddings and "head" not in ck.params
    ids = np.arange(12)[None] % 61
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits.numpy()
    got = nnx.merge(ck.graphdef, ck.params)(jnp.asarray(ids))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_tokenizer_from_tokenizer_json(saved, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog", "to be or not to be"] * 4,
        trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", tok.token_to_id("<s>"))])
    path = _copy(saved[0], tmp_path / "ck")
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, 0]}, f)
    ours = hfc.load_tokenizer(path)
    assert ours.eos_ids == (2, 0)
    text = "the lazy fox to be"
    ids = ours.encode(text)
    assert ids[0] == tok.token_to_id("<s>") and len(ids) > 3
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
    assert ids == ref(text)["input_ids"]
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    with pytest.raises(ValueError, match="tokenizer.json: no such file"):
        hfc.load_tokenizer(saved[0])
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        f.write("{}")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        hfc.load_tokenizer(path)
