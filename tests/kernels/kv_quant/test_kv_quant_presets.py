"""The run's quantizers (``quantizer_configs``): the paper presets at the run's settings, QVG
with its keys stored after RoPE beside them, blocks clamped to the head dim."""

import types

import chex
import jax
import jax.numpy as jnp
import pytest

from kernels.kv_quant import reference as ref
from kernels.kv_quant.cache import cache_bytes
from models.kv_cache import get_backend

FIELDS = dict(bits=2, chunk=256, num_centroids=16, kmeans_iters=20, seed=3, qvg_block=64,
              qvg_pro_block=16, qvg_pro_stages=4, kivi_group=32, kivi_block=32)


def test_presets_at_the_settings_and_a_wide_head():
    q = ref.quantizer_configs(ref.QuantizerSettings(**FIELDS), 128)
    common = dict(bits=2, num_centroids=16, chunk=256, kmeans_iters=20, seed=3)
    assert set(q) == {"qvg", "qvg_post_rope", "qvg_pro", "kivi"}
    assert q["qvg"] == ref.QVGConfig(stages=1, block=64, **common)
    assert q["qvg"].pre_rope and q["qvg_pro"].pre_rope  # the paper's choice
    assert q["qvg_post_rope"] == ref.QVGConfig(stages=1, block=64, pre_rope=False, **common)
    assert q["qvg_pro"] == ref.QVGConfig(stages=4, block=16, **common)
    assert q["kivi"] == ref.KIVIConfig(bits=2, group=32, block=32, residual=256)


def test_blocks_are_clamped_to_a_narrow_head():
    q = ref.quantizer_configs(ref.QuantizerSettings(**FIELDS), 16)
    assert (q["qvg"].block, q["qvg_post_rope"].block, q["qvg_pro"].block,
            q["kivi"].block) == (16, 16, 16, 16)


def test_post_rope_keys_are_stored_in_the_same_bytes_but_other_codes():
    """A QVG cache of the post-RoPE quantizer holds as many bytes, in the same arrays, as one of
    the paper's pre-RoPE quantizer over the same keys (so the same effective bits), but codes of
    other keys (the rotated ones)."""
    fields = dict(FIELDS, chunk=16, num_centroids=2, kmeans_iters=2, kivi_group=16)
    q = ref.quantizer_configs(ref.QuantizerSettings(**fields), 16)
    kk, kv = jax.random.split(jax.random.key(5))
    k = jax.random.normal(kk, (1, 2, 48, 16), jnp.bfloat16)
    v = jax.random.normal(kv, (1, 2, 48, 16), jnp.bfloat16)
    layers = {}
    for m in ("qvg", "qvg_post_rope"):
        be = get_backend("qvg", config=q[m], rope_base=10_000.0)
        layers[m] = jax.jit(be.update)(be.init(1, 48, 2, 16, jnp.bfloat16), k, v,
                                       jnp.zeros((1,), jnp.int32))
    shapes = {m: jax.tree.map(lambda x: (x.shape, x.dtype), layer) for m, layer in layers.items()}
    assert shapes["qvg"] == shapes["qvg_post_rope"]
    assert cache_bytes([layers["qvg"]]) == cache_bytes([layers["qvg_post_rope"]])
    assert (ref.effective_bits(q["qvg_post_rope"], 16, 48)
            == ref.effective_bits(q["qvg"], 16, 48))
    # the values are the same codes; the keys differ (rotated before quantization or not)
    chex.assert_trees_all_equal(layers["qvg"]["v"], layers["qvg_post_rope"]["v"])
    assert not jnp.array_equal(layers["qvg"]["k"].codes, layers["qvg_post_rope"]["k"].codes)


def test_settings_read_from_a_run_config_give_the_same_quantizers():
    config = types.SimpleNamespace(**FIELDS, context=1024)  # extra fields are ignored
    settings = ref.QuantizerSettings.of(config)
    assert settings == ref.QuantizerSettings(**FIELDS)
    assert ref.quantizer_configs(config, 64) == ref.quantizer_configs(settings, 64)
    with pytest.raises(ValueError, match=r"QuantizerSettings.of: the fields \['chunk'"):
        ref.QuantizerSettings.of(types.SimpleNamespace(bits=2))
