"""Llama-family decoder against the `transformers` reference models (tiny random checkpoints).

Parity bounds (measured on random checkpoints with weights ~ N(0, 0.3^2), logits of magnitude ~3):
float32 logits agree to 2e-6 absolute; the tests allow 1e-5 x max|logit|. With bfloat16 parameters
and activations they agree with the float32 reference to 1.6e-2 x max|logit| (0.040 absolute;
bfloat16's relative rounding is 2^-9 per operation); the tests allow 5e-2 x max|logit|.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cache_backend
from models import hf_checkpoint as hfc
from models import llama as llama_lib
from models.llama import Llama, backend_for
from models.rope import RotaryEmbedding
from models.sampling import generate
from tests.hypothesis_budget import examples

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 97
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=None, eos_token_id=None)
F32_REL = 1e-5  # float32 logits: |ours - transformers| <= F32_REL * max|logit|
BF16_REL = 5e-2

# name -> (transformers config class, model class, extra config); each exercises one option.
VARIANTS = {
    # Llama 3.1 RoPE scaling (original context 16 < the 40 tokens tested), theta 5000, GQA 4/2.
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=5000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0,
                                             original_max_position_embeddings=16))),
    # YaRN (attention factor 1.139), tied embeddings, biases on q/k/v/o.
    "yarn": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=5000.0, tie_word_embeddings=True, attention_bias=True,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64))),
    # Qwen2: q/k/v biases; the second layer has a sliding window of 5.
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    # Mistral: sliding window of 6 in every layer.
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=6)),
}


def _save(name: str, path: str):
    cfg_cls, model_cls, extra = VARIANTS[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**COMMON, **extra)
    model = getattr(transformers, model_cls)(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.eval()
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    out = {}
    for name in VARIANTS:
        path = str(tmp_path_factory.mktemp(name))
        out[name] = (path, _save(name, path))
    return out


def _tokens(b: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (b, length))


def _reference_logits(hf_model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor(ids)).logits.float().numpy()


def _with_config(ck: hfc.Checkpoint, **changes):
    """The loaded parameters in a model whose config differs (e.g. no window)."""
    cfg = dataclasses.replace(ck.config, **changes)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, ck.params)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_float32(ckpts, name):
    path, hf_model = ckpts[name]
    ck = hfc.load_checkpoint(path)
    ids = _tokens(2, 40)
    want = _reference_logits(hf_model, ids)
    got = np.asarray(jax.jit(lambda p, t: nnx.merge(ck.graphdef, p)(t))(ck.params,
                                                                       jnp.asarray(ids)))
    bound = F32_REL * np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)
    # The option under test matters: dropping it moves the logits far outside the bound.
    plain = {"llama3": dict(rope=RotaryEmbedding(5000.0)),
             "yarn": dict(rope=RotaryEmbedding(5000.0)),
             "qwen2": dict(layer_windows=None), "mistral": dict(layer_windows=None)}[name]
    off = np.asarray(_with_config(ck, **plain)(jnp.asarray(ids)))
    assert np.abs(off - want).max() > 100 * bound


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_logits_match_transformers_bfloat16(ckpts, name):
    path, hf_model = ckpts[name]
    ck = hfc.load_checkpoint(path, dtype="bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(ck.params))
    ids = _tokens(2, 40, seed=1)
    want = _reference_logits(hf_model, ids)
    got = np.asarray(nnx.merge(ck.graphdef, ck.params)(jnp.asarray(ids)))
    err = np.abs(got - want).max()
    assert err <= BF16_REL * np.abs(want).max()
    assert err > 1e-4  # it really ran in bfloat16


def _hf_greedy(hf_model, prompt: np.ndarray, n: int):
    with torch.no_grad():
        out = hf_model.generate(torch.tensor(prompt), max_new_tokens=n, do_sample=False,
                                output_scores=True, return_dict_in_generate=True,
                                pad_token_id=0)
    toks = out.sequences[:, prompt.shape[1]:].numpy()
    scores = torch.stack(out.scores, 1).float().numpy()  # [B, N, V]
    top2 = np.sort(scores, axis=-1)[..., -2:]
    return toks, top2[..., 1] - top2[..., 0], np.abs(scores).max()


@pytest.mark.parametrize("name", ["yarn", "qwen2", "mistral"])  # llama3: with every backend below
def test_greedy_generation_matches_transformers(ckpts, name):
    path, hf_model = ckpts[name]
    ck = hfc.load_checkpoint(path)
    prompt = _tokens(2, 10, seed=2)
    want, margins, scale = _hf_greedy(hf_model, prompt, 14)  # 24 > every window: they slide
    got, _ = generate(ck.graphdef, ck.params, jnp.asarray(prompt, jnp.int32), jax.random.key(0),
                      max_new_tokens=14, temperature=0.0)
    assert margins.min() > 4 * F32_REL * scale  # no near-tie: every token must match
    np.testing.assert_array_equal(np.asarray(got), want)


# -- every KV backend on the Llama-3-scaled model --------------------------------------------------

PROMPT, TOTAL = 20, 32


def _decode_logits(ck, backend, ids, entrokv_fraction=None):
    """Teacher-forced decode of ``ids`` [B, TOTAL]: prefill PROMPT tokens, then one token per
    step; logits [B, T, V] predicting positions PROMPT .. TOTAL (T = TOTAL - PROMPT + 1). With
    ``entrokv_fraction`` the (budgeted dense) cache keeps the prompt tokens EntroKV selects."""
    from algorithms.kv_budget import cache as budget
    from algorithms.kv_budget.entrokv import EntroKVConfig

    @jax.jit
    def run(params, tokens):
        model = nnx.merge(ck.graphdef, params)
        b = tokens.shape[0]
        cache = model.init_cache(b, TOTAL, backend)
        logits, cache = model.decode(tokens[:, :PROMPT], cache, jnp.zeros((b,), jnp.int32),
                                     backend)
        keep = None
        if entrokv_fraction is not None:  # SnapKV-style: evict after the full prefill
            qk = budget.prompt_queries_keys(model, tokens[:, :PROMPT])
            _, keep = budget.budgets_and_keep(qk, EntroKVConfig(window=4), entrokv_fraction,
                                              "entrokv")
            cache = budget.with_keep(cache, keep)

        def step(cache, t):
            tok = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)
            out, cache = model.decode(tok, cache, jnp.full((b,), t), backend)
            return model.flush_cache(cache, backend), out[:, 0]  # QVG / KIVI: chunk quantization

        cache, steps = jax.lax.scan(step, cache, jnp.arange(PROMPT, TOTAL))
        return jnp.concatenate([logits[:, -1:], steps.transpose(1, 0, 2)], axis=1), keep, cache

    logits, keep, cache = run(ck.params, jnp.asarray(ids, jnp.int32))
    return np.asarray(logits), keep, cache


def _qvg(bits, rope=None):
    from kernels.kv_quant.reference import QVGConfig
    return dict(config=QVGConfig(bits=bits, stages=1, block=8, num_centroids=4, chunk=8,
                                 kmeans_iters=3), **({"rope_base": rope} if rope else {}))


def _kivi(bits):
    from kernels.kv_quant.reference import KIVIConfig
    return dict(config=KIVIConfig(bits=bits, group=4, block=8, residual=8))


# backend -> (kwargs, bound relative to max|logit|). Exact settings: Quest with a page budget that
# covers the cache. FFD at delta = inf attends every page, but over its refined keys (2-bit code +
# float8 residual) and bfloat16 values; QVG / KIVI at 8 bits. Measured: ffd 6.1e-3, qvg 2.9e-3,
# kivi 4.7e-3 of max|logit| (2.69); the smallest top-2 margin of transformers' greedy steps is
# 0.018, so every backend's argmax is transformers' token at every step.
BACKENDS = {
    "dense": ({}, F32_REL),
    "quest": (dict(page_size=8, top_k=4), F32_REL),
    "ffd": (dict(page_size=16, delta=math.inf), 2e-2),
    "qvg": (_qvg(8), 1e-2),
    "kivi": (_kivi(8), 1e-2),
}


@pytest.fixture(scope="module")
def llama3(ckpts):
    """The Llama-3-scaled model, a prompt + transformers' greedy continuation, and its logits."""
    path, hf_model = ckpts["llama3"]
    ck = hfc.load_checkpoint(path)
    prompt = _tokens(2, PROMPT, seed=3)
    cont, margins, _ = _hf_greedy(hf_model, prompt, TOTAL - PROMPT + 1)
    ids = np.concatenate([prompt, cont[:, :-1]], axis=1)  # [B, TOTAL]
    want = _reference_logits(hf_model, ids)[:, PROMPT - 1:]  # predicts cont: [B, 13, V]
    return ck, ids, want, cont, margins


def _scanned(ck: hfc.Checkpoint) -> hfc.Checkpoint:
    """The checkpoint's model with its layers stacked and scanned (``scan_layers=True``)."""
    cfg, graphdef, params = llama_lib.scanned(ck.config, ck.params)
    return hfc.Checkpoint(cfg, graphdef, params)


@pytest.mark.parametrize("layout", ["unrolled", "scanned"])
@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_backend_decodes_and_generates_like_transformers(llama3, name, layout):
    """Teacher-forced on transformers' greedy continuation, every step's logits are within the
    backend's bound, and their argmax is transformers' next token, so greedy generation with the
    backend reproduces transformers' tokens (by induction over the steps). The same holds with
    the layers scanned over stacked parameters and a stacked cache."""
    ck, ids, want, cont, _ = llama3
    kwargs, rel = BACKENDS[name]
    model = ck if layout == "unrolled" else _scanned(ck)
    got, _, cache = _decode_logits(model, backend_for(name, ck.config, **kwargs), ids)
    bound = rel * np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= bound, (name, err, bound)
    if rel > F32_REL:  # a lossy cache: really lossy, yet close
        assert err > F32_REL * np.abs(want).max()
    np.testing.assert_array_equal(got.argmax(-1), cont)
    if name == "qvg":
        first = cache[0] if layout == "unrolled" else jax.tree.map(lambda a: a[0], cache)
        _check_qvg_stores_pre_rope_keys(ck, ids, first)


def _check_qvg_stores_pre_rope_keys(ck, ids, layer_cache):
    """QVG undoes RoPE before quantizing keys and re-applies it when attending. With the
    checkpoint's Llama-3-scaled RoPE (what backend_for passes), the stored 8-bit keys are layer 0's
    pre-RoPE keys; undoing the plain-theta RoPE instead would leave them rotated by the scaling
    difference, far from the pre-RoPE ones."""
    from kernels.kv_quant import reference as qref
    from kernels.rope import apply_rope

    model = nnx.merge(ck.graphdef, ck.params)
    attn, cfg = model.blocks[0].attn, ck.config
    x = model.blocks[0].norm1(model.embed(jnp.asarray(ids)))
    b, s = ids.shape
    pre = attn.k_proj(x).reshape(b, s, cfg.kv_heads, cfg.dim_per_head)  # [B, S, K, D]
    pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    n = (s // 8) * 8  # slots in full (quantized) chunks of 8
    stored = qref._dequant_chunks(layer_cache["k"], 8)[:, :, :n].transpose(0, 2, 1, 3)
    scale = float(jnp.abs(pre).max())
    assert float(jnp.abs(stored - pre[:, :n]).max()) < 2e-2 * scale
    plain = apply_rope(apply_rope(pre, pos, cfg.rope), -pos, RotaryEmbedding(cfg.rope.theta))
    assert float(jnp.abs(plain[:, :n] - pre[:, :n]).max()) > 0.3 * scale


def test_greedy_generate_with_an_exact_sparse_backend(llama3):
    """models.sampling.generate with Quest (page budget covering the cache) = transformers."""
    ck, ids, _, cont, margins = llama3
    got, _ = generate(ck.graphdef, ck.params, jnp.asarray(ids[:, :PROMPT], jnp.int32),
                      jax.random.key(0), max_new_tokens=TOTAL - PROMPT + 1, temperature=0.0,
                      backend=backend_for("quest", ck.config, page_size=11, top_k=3))
    assert margins.min() > 4 * F32_REL * 3.0
    np.testing.assert_array_equal(np.asarray(got), cont)


def test_entrokv_budgets_as_a_selection_policy(llama3):
    """EntroKV's budgets select prompt tokens per kv head of the Llama model (SnapKV-style
    eviction after the prefill): half the prompt per head on average, the observation window
    always kept, and the logits change. (Keeping the whole prompt equals the dense cache:
    tests/experiments/test_generate.py.)"""
    from algorithms.kv_budget.cache import BudgetedKVCache

    ck, ids, want, _, _ = llama3
    half, keep, _ = _decode_logits(ck, BudgetedKVCache(), ids, entrokv_fraction=0.5)
    np.testing.assert_allclose(half[:, 0], want[:, 0], rtol=0, atol=F32_REL * np.abs(want).max())
    assert np.isfinite(half).all() and np.abs(half[:, 1:] - want[:, 1:]).max() > 1e-3
    kept = np.stack([np.asarray(k) for k in keep])  # [L, B, K, P]
    assert kept[..., -4:].all() and 0.3 < kept.mean() < 0.7
    # the stacked cache of the scanned layout takes the same masks and gives the same logits
    half_scanned, keep_scanned, _ = _decode_logits(_scanned(ck), BudgetedKVCache(), ids,
                                                   entrokv_fraction=0.5)
    np.testing.assert_array_equal(np.stack([np.asarray(k) for k in keep_scanned]), kept)
    np.testing.assert_allclose(half_scanned, half, rtol=0, atol=F32_REL * np.abs(want).max())


@pytest.mark.parametrize("name", ["llama3", "mistral"])
def test_scanned_layers_match_transformers(ckpts, name):
    """scan_layers=True (one lax.scan over stacked parameters) gives transformers' logits in the
    forward pass, Mistral's window (the same in every layer) included; the converted parameters
    are the unrolled ones stacked."""
    path, hf_model = ckpts[name]
    ck = hfc.load_checkpoint(path)
    ids = _tokens(2, 40)
    want = _reference_logits(hf_model, ids)
    sk = _scanned(ck)
    assert sk.config.scan_layers and not ck.config.scan_layers
    got = np.asarray(jax.jit(lambda p, t: nnx.merge(sk.graphdef, p)(t))(sk.params,
                                                                       jnp.asarray(ids)))
    np.testing.assert_allclose(got, want, rtol=0, atol=F32_REL * np.abs(want).max())
    q0 = ck.params["blocks"][1]["attn"]["q_proj"]["kernel"][...]
    np.testing.assert_array_equal(sk.params["blocks"]["attn"]["q_proj"]["kernel"][...][1], q0)


def test_scanned_layers_refusals(ckpts):
    """Layers of different windows (Qwen2's max_window_layers) cannot share one scanned block;
    a scanned config is not converted twice; a list cache is refused by the scanned decode."""
    qwen = hfc.load_checkpoint(ckpts["qwen2"][0])
    with pytest.raises(ValueError, match="one window for every layer"):
        llama_lib.scanned(qwen.config, qwen.params)
    sk = _scanned(hfc.load_checkpoint(ckpts["llama3"][0]))
    with pytest.raises(ValueError, match="already has scan_layers=True"):
        llama_lib.scanned(sk.config, sk.params)
    model = nnx.merge(sk.graphdef, sk.params)
    layers = [cache_backend.DenseKVCache().init(1, 8, 2, 16, jnp.float32)] * 2
    with pytest.raises(ValueError, match="list of 2 per-layer entries"):
        model.decode(jnp.zeros((1, 1), jnp.int32), layers, jnp.zeros((1,), jnp.int32))


def test_sliding_window_refused_by_backends_that_cannot_forget(ckpts):
    ck = hfc.load_checkpoint(ckpts["mistral"][0])
    model = nnx.merge(ck.graphdef, ck.params)
    for name, kwargs in (("ffd", dict(page_size=16)), ("quest", dict(page_size=8)),
                         ("qvg", _qvg(8, None)), ("kivi", _kivi(8))):
        with pytest.raises(ValueError, match="sliding window of 6 tokens"):
            model.init_cache(1, 32, backend_for(name, ck.config, **kwargs))
    model.init_cache(1, 32, cache_backend.DenseKVCache())  # the dense cache honours it
    model.init_cache(1, 6, backend_for("kivi", ck.config, **_kivi(8)))  # within the window


# -- RoPE scaling against transformers' own frequency functions ------------------------------------


@settings(max_examples=examples(25), deadline=None)
@given(kind=st.sampled_from(["linear", "llama3", "yarn"]),
       theta=st.sampled_from([1e4, 5e5, 1e6]), factor=st.sampled_from([2.0, 4.0, 8.0, 32.0]),
       orig=st.sampled_from([512, 4096, 8192]), head_dim=st.sampled_from([64, 128]))
def test_rope_frequencies_match_transformers(kind, theta, factor, orig, head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(rope_type=kind, factor=factor, rope_theta=theta)
    if kind != "linear":
        params["original_max_position_embeddings"] = orig
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    hf = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4,
                                  max_position_embeddings=orig * int(factor),
                                  rope_parameters=params)
    inv_freq, attn = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
    ours = hfc.config_from_hf(hf.to_dict()).rope
    np.testing.assert_allclose(ours.inv_freq(head_dim), inv_freq.numpy(), rtol=2e-6, atol=0)
    assert ours.attention_scale == pytest.approx(attn, rel=1e-12)
    if kind == "yarn":
        assert ours.attention_scale == pytest.approx(0.1 * math.log(factor) + 1.0)
