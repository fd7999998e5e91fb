"""Loading Hugging Face checkpoint directories: configs, sharded weights, bad input, tokenizer."""

import dataclasses
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
                                "use_sliding_window": True,
                                "layer_types": ["full_attention", "sliding_attention"] * 2})
    assert typed.layer_windows == (None, 5, None, 5)
    # transformers' Qwen2 windows nothing without use_sliding_window (its model then fails on
    # sliding_attention layers): refused
    with pytest.raises(ValueError, match="sliding_attention layers but no window"):
        hfc.config_from_hf({**base, "model_type": "qwen2", "sliding_window": 5,
                            "layer_types": ["full_attention", "sliding_attention"] * 2})
    # 32 layers, no max_window_layers: transformers windows layers 28..31 (its default is 28)
    qwen32 = hfc.config_from_hf({**base, "num_hidden_layers": 32, "model_type": "qwen2",
                                 "use_sliding_window": True, "sliding_window": 8})
    assert qwen32.layer_windows == (None,) * 28 + (8,) * 4
    # Llama ignores windows; Mistral's window defaults to 4096 and is off only when null
    assert hfc.config_from_hf({**base, "model_type": "llama", "sliding_window": 6,
                               "layer_types": ["sliding_attention"] * 4}).layer_windows is None
    assert hfc.config_from_hf({**base, "model_type": "mistral"}).layer_windows == (4096,) * 4
    assert hfc.config_from_hf({**base, "model_type": "mistral",
                               "sliding_window": None}).layer_windows is None


# -- every config.json key the loader reads, absent: the reference's default -------------------

# A config of each model type whose every key read by the loader differs from the reference's
# default, so that dropping any one key changes the model the reference builds.
_BASE = dict(vocab_size=99, hidden_size=512, intermediate_size=96, num_hidden_layers=30,
             num_attention_heads=64, num_key_value_heads=4, head_dim=16,
             max_position_embeddings=300, rms_norm_eps=1e-5, tie_word_embeddings=True,
             rope_theta=5e5, hidden_act="silu", partial_rotary_factor=1.0, eos_token_id=7)
_BASES = {
    "llama": {**_BASE, "attention_bias": True, "mlp_bias": False},
    "mistral": {**_BASE, "sliding_window": 6},
    "qwen2": {**_BASE, "use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2},
}
_ABSENT = [(mt, key) for mt in hfc.SUPPORTED_MODEL_TYPES for key in [None, *hfc.HF_DEFAULTS[mt]]]


def _reference_view(hf: dict) -> dict:
    """What transformers builds from ``hf``: sizes and biases of its model (on the meta device,
    nothing allocated), norm epsilon, RoPE frequencies, per-layer windows, EOS of generation."""
    hf = dict(hf)
    model_type = hf.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **hf)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    layer = "model.layers.0."
    attn = model.model.layers[0].self_attn
    n = len(model.model.layers)
    if model_type == "qwen2":  # per layer, from config.layer_types
        windows = tuple(b.self_attn.sliding_window for b in model.model.layers)
    elif model_type == "mistral":  # every layer gets config.sliding_window
        windows = (cfg.sliding_window,) * n
    else:  # LlamaAttention has no window
        windows = (None,) * n
    rotary = type(model.model.rotary_emb)(config=cfg)
    eos = transformers.GenerationConfig.from_model_config(cfg).eos_token_id
    return dict(
        vocab=shapes["model.embed_tokens.weight"][0], width=shapes["model.embed_tokens.weight"][1],
        mlp=shapes[layer + "mlp.gate_proj.weight"][0], layers=n,
        q=shapes[layer + "self_attn.q_proj.weight"][0],
        kv=shapes[layer + "self_attn.k_proj.weight"][0], head_dim=attn.head_dim,
        qkv_bias=layer + "self_attn.q_proj.bias" in shapes,
        out_bias=layer + "self_attn.o_proj.bias" in shapes,
        mlp_bias=layer + "mlp.gate_proj.bias" in shapes, act=cfg.hidden_act,
        tie=bool(cfg.tie_word_embeddings), max_len=cfg.max_position_embeddings,
        eps=model.model.norm.variance_epsilon, inv_freq=rotary.inv_freq.numpy().tolist(),
        attention_scale=float(rotary.attention_scaling), windows=windows,
        eos=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]))


def _our_view(hf: dict, tmp_path) -> dict:
    cfg = hfc.config_from_hf(hf)
    d = cfg.dim_per_head
    # the EOS ids come from config.json through load_tokenizer
    from tokenizers import Tokenizer, models

    tmp_path.mkdir(exist_ok=True)
    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(
        str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return dict(
        vocab=cfg.vocab_size, width=cfg.d_model, mlp=cfg.mlp_dim, layers=cfg.num_layers,
        q=cfg.num_heads * d, kv=cfg.num_kv_heads * d, head_dim=d, qkv_bias=cfg.qkv_bias,
        out_bias=cfg.out_bias, mlp_bias=False, act="silu", tie=cfg.tie_embeddings,
        max_len=cfg.max_len, eps=cfg.norm_eps, inv_freq=cfg.rope.inv_freq(d).tolist(),
        attention_scale=cfg.rope.attention_scale,
        windows=cfg.layer_windows or (None,) * cfg.num_layers,
        eos=hfc.load_tokenizer(str(tmp_path)).eos_ids)


@pytest.mark.parametrize("model_type,key", _ABSENT, ids=[f"{m}-{k}" for m, k in _ABSENT])
def test_an_absent_key_means_what_it_means_to_transformers(model_type, key, tmp_path):
    """Each config.json key the loader reads, dropped from a config where it differs from the
    default: the model we build is the one transformers builds (sizes, biases, epsilon, RoPE,
    windows, EOS); None: the full config, where both must agree too."""
    hf = {"model_type": model_type, **_BASES[model_type]}
    if key is not None:
        del hf[key]
    ours, ref = _our_view(hf, tmp_path / "ck"), _reference_view(hf)
    assert set(ours) == set(ref)
    for name in ref:
        if name == "inv_freq":
            np.testing.assert_allclose(ours[name], ref[name], rtol=2e-6, err_msg=name)
        else:
            assert ours[name] == pytest.approx(ref[name]), name


def test_the_defaults_table_is_the_reference_config_classes():
    """HF_DEFAULTS equals the field defaults of transformers' config classes, key by key (the
    keys that are no field of a class: RoPE's theta and partial rotary factor, Qwen2's head_dim,
    which its modeling code derives as E // H)."""
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

    classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config}
    for model_type, table in hfc.HF_DEFAULTS.items():
        cls = classes[model_type]
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        for key, ours in table.items():
            if key == "rope_theta":
                assert ours == cls.default_theta == RotaryEmbeddingConfigMixin.default_theta
            elif key == "partial_rotary_factor" or (key == "head_dim" and key not in fields):
                assert ours in (1.0, None), (model_type, key)
            else:
                assert fields[key] == ours, (model_type, key)
        # and every key the reference class reads that we read has a row
        read = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "hidden_act",
                "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "eos_token_id",
                "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window",
                "max_window_layers", "head_dim"}
        assert read & set(fields) <= set(table), (model_type, read & set(fields) - set(table))


@pytest.mark.parametrize("scaling,match", [
    ({"rope_type": "linear"}, "rope type 'linear' needs factor"),
    ({"rope_type": "yarn"}, "rope type 'yarn' needs factor"),
    ({"rope_type": "llama3", "factor": 8.0}, "needs low_freq_factor, high_freq_factor"),
])
def test_rope_without_a_key_its_type_needs_is_refused(scaling, match):
    """transformers refuses these too (KeyError: missing required keys)."""
    hf = {"model_type": "llama", **SMALL, "rope_scaling": scaling}
    with pytest.raises(KeyError):
        transformers.LlamaConfig.from_dict({k: v for k, v in hf.items() if k != "model_type"})
    with pytest.raises(ValueError, match=match):
        hfc.config_from_hf(hf, where="ck/config.json")


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 4.0},  # original_max_position_embeddings: the default max
    {"type": "yarn", "factor": 4.0, "beta_fast": None},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
])
def test_rope_defaults_with_max_position_embeddings_absent(scaling, tmp_path):
    hf = {"model_type": "llama", **{k: v for k, v in _BASES["llama"].items()
                                    if k != "max_position_embeddings"}, "rope_scaling": scaling}
    ours, ref = _our_view(hf, tmp_path / "ck"), _reference_view(hf)
    np.testing.assert_allclose(ours["inv_freq"], ref["inv_freq"], rtol=2e-6)
    assert ours["attention_scale"] == pytest.approx(ref["attention_scale"], rel=1e-12)
    assert ours["max_len"] == ref["max_len"] == 2048


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
    for bad in ("2", 2.5, [2, None], True, -1):
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": bad}, f)
        with pytest.raises(ValueError, match=r"generation_config.json: eos_token_id must be"):
            hfc.load_tokenizer(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, 0]}, f)
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


# -- prompts in, ids out, text back: against transformers' tokenizer of the same tokenizer.json ---

HAMLET = ("to be or not to be that is the question whether tis nobler in the mind to suffer "
          "the slings and arrows of outrageous fortune")


def _tokenizer_dir(tmp_path, kind: str) -> str:
    """A tokenizer.json trained here: ``metaspace`` (SentencePiece-style "▁" words, as Llama-2
    and Mistral) or ``bytelevel`` (GPT-2-style bytes, as Llama-3 and Qwen2); both put <s> first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    if kind == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = []
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([HAMLET] * 4, trainers.BpeTrainer(
        vocab_size=150, special_tokens=["<s>", "</s>"], initial_alphabet=alphabet))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    path = tmp_path / kind
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return str(path)


def _reference_tokenizer(path: str):
    return transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))


@pytest.mark.parametrize("kind", ["metaspace", "bytelevel"])
def test_a_prompt_that_begins_with_bos_gets_one_bos(tmp_path, kind):
    path = _tokenizer_dir(tmp_path, kind)
    ours, ref = hfc.load_tokenizer(path), _reference_tokenizer(path)
    bos = ref.convert_tokens_to_ids("<s>")
    assert ours.prefix_ids() == (bos,)
    # a plain prompt: the post-processor's BOS, as transformers encodes it
    ids, dropped, cut = ours.encode_prompt("to be or")
    assert ids == ref("to be or")["input_ids"] and ids[0] == bos and dropped == cut == 0
    # a chat-template-like prompt that carries its own BOS text: the tokenizer alone gives two
    templated = "<s>to be or"
    assert ours.encode(templated)[:2] == [bos, bos]
    ids, dropped, _ = ours.encode_prompt(templated)
    assert dropped == 1 and ids[0] == bos and ids.count(bos) == 1
    assert ids == ref(templated, add_special_tokens=False)["input_ids"]
    # a BOS text inside the prompt is text the user wrote, not a duplicate: kept
    ids, dropped, _ = ours.encode_prompt("to <s> be")
    assert dropped == 0 and ids == ref("to <s> be")["input_ids"] and ids.count(bos) == 2


def _word_tokenizer(path, single: str | None) -> str:
    """A word-level tokenizer.json in ``path`` whose ids for "to be or not to be" are
    [4, 3, 7, 6, 4, 3], with post-processing template ``single`` (None: none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "be": 3, "to": 4, "that": 5, "not": 6, "or": 7}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    if single is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[("<s>", 1), ("</s>", 2)])
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(str(path), "tokenizer.json"))
    return str(path)


@pytest.mark.parametrize("single,want,cut", [
    ("<s> $A </s>", [1, 4, 3, 7, 6, 4, 3], 1),   # the template's EOS is not part of the prompt
    ("$A </s>", [4, 3, 7, 6, 4, 3], 1),
    ("<s> $A", [1, 4, 3, 7, 6, 4, 3], 0),        # a template that adds nothing after: untouched
    (None, [4, 3, 7, 6, 4, 3], 0),
])
def test_a_prompt_does_not_end_in_the_eos_its_template_appends(tmp_path, single, want, cut):
    path = _word_tokenizer(tmp_path / "tok", single)
    ours, ref = hfc.load_tokenizer(path), _reference_tokenizer(path)
    text = "to be or not to be"
    # what the tokenizer alone gives (transformers encodes the same), EOS last where templated
    assert ours.encode(text) == ref(text)["input_ids"] == want + [2] * cut
    assert ours.suffix_ids() == (2,) * cut
    ids, dropped, dropped_suffix = ours.encode_prompt(text)
    assert ids == want and dropped == 0 and dropped_suffix == cut
    # a prompt that itself ends with the EOS text keeps that one (the user wrote it)
    ids, _, dropped_suffix = ours.encode_prompt(text + " </s>")
    assert ids == want + [2] and dropped_suffix == cut


@pytest.mark.parametrize("kind", ["metaspace", "bytelevel"])
def test_a_continuation_keeps_its_leading_space(tmp_path, kind):
    """decode(prompt ids) + continuation == decode(all ids), as transformers decodes them."""
    path = _tokenizer_dir(tmp_path, kind)
    ours, ref = hfc.load_tokenizer(path), _reference_tokenizer(path)
    prompt, full = "to be or", "to be or is nobler in the mind"
    prompt_ids, all_ids = ours.encode(prompt), ours.encode(full)
    assert all_ids[:len(prompt_ids)] == prompt_ids  # word-wise: the prompt's ids are a prefix
    new = all_ids[len(prompt_ids):]
    text = ours.decode_continuation(prompt_ids, new)
    assert text == " is nobler in the mind"
    assert prompt + text == ref.decode(all_ids, skip_special_tokens=True) == full
    if kind == "metaspace":  # decoded alone, the first word's "▁" is taken for a text start
        assert ours.decode(new) == "is nobler in the mind"


def test_a_continuation_that_completes_a_character(tmp_path):
    """Byte-level ids can end inside a UTF-8 character: the prompt's text then ends in U+FFFD,
    which the full text does not have; the continuation starts with the completed character."""
    path = _tokenizer_dir(tmp_path, "bytelevel")
    ours = hfc.load_tokenizer(path)
    ids = ours.encode("to be é", add_special_tokens=False)
    assert len(ids) >= 2 and ours.decode(ids[:-1]).endswith("\ufffd")  # é: two byte tokens
    assert ours.decode_continuation(ids[:-1], ids[-1:]) == "é"
    assert ours.decode_continuation(ids[:-1], ids[-1:] + ours.encode(" or", False)) == "é or"
