"""The run's three quantizers (``quantizer_configs``): the paper presets at the run's settings,
blocks clamped to the head dim."""

import types

import pytest

from kernels.kv_quant import reference as ref

FIELDS = dict(bits=2, chunk=256, num_centroids=16, kmeans_iters=20, seed=3, qvg_block=64,
              qvg_pro_block=16, qvg_pro_stages=4, kivi_group=32, kivi_block=32)


def test_presets_at_the_settings_and_a_wide_head():
    q = ref.quantizer_configs(ref.QuantizerSettings(**FIELDS), 128)
    common = dict(bits=2, num_centroids=16, chunk=256, kmeans_iters=20, seed=3)
    assert q["qvg"] == ref.QVGConfig(stages=1, block=64, **common)
    assert q["qvg_pro"] == ref.QVGConfig(stages=4, block=16, **common)
    assert q["kivi"] == ref.KIVIConfig(bits=2, group=32, block=32, residual=256)


def test_blocks_are_clamped_to_a_narrow_head():
    q = ref.quantizer_configs(ref.QuantizerSettings(**FIELDS), 16)
    assert (q["qvg"].block, q["qvg_pro"].block, q["kivi"].block) == (16, 16, 16)


def test_settings_read_from_a_run_config_give_the_same_quantizers():
    config = types.SimpleNamespace(**FIELDS, context=1024)  # extra fields are ignored
    settings = ref.QuantizerSettings.of(config)
    assert settings == ref.QuantizerSettings(**FIELDS)
    assert ref.quantizer_configs(config, 64) == ref.quantizer_configs(settings, 64)
    with pytest.raises(ValueError, match=r"QuantizerSettings.of: the fields \['chunk'"):
        ref.QuantizerSettings.of(types.SimpleNamespace(bits=2))
