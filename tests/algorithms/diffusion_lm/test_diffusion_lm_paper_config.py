"""The accelerator-scale ``paper`` variant builds and lowers one training step on the CPU."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from algorithms.diffusion_lm.families import FamilySpec, transformer_config
from algorithms.diffusion_lm.grid import family_spec, optimizer
from algorithms.diffusion_lm.training import init_state, make_step
from core import config as cfg_lib
from experiments.configs import diffusion_lm as dlm_config
from models.transformer import Transformer, param_count


def test_paper_variant_lowers_one_step_abstractly():
    config = dlm_config.get_config("paper")
    assert config.seq_len == 1024 and config.optim.learning_rate == 3e-4
    assert config.optim.warmup_steps == 2500 and config.ema_decay == 0.9999
    d, layers, heads = config.sizes[config.reference_size]
    assert (d, layers, heads) == (768, 12, 12)                   # DiT-small
    spec = FamilySpec("mdlm")
    cfg = transformer_config(spec, config.seq_len, d_model=d, num_layers=layers, num_heads=heads)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)
    assert 80e6 < param_count(params) < 120e6
    tx = optimizer(config.optim)
    state = jax.eval_shape(lambda p: init_state(p, tx, config.ema_decay), params)
    batch = {"x": jax.ShapeDtypeStruct((config.batch_size, config.seq_len), jnp.int32),
             "train": jax.ShapeDtypeStruct((), jnp.float32),
             "ce": jax.ShapeDtypeStruct((), jnp.float32)}
    key = jax.eval_shape(lambda: jax.random.key(0))
    step = jax.jit(make_step(graphdef, tx, spec, config.ema_decay), donate_argnums=0)
    new_state, metrics = jax.eval_shape(step, state, batch, key)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert metrics["nelbo"].shape == () and "ema" in new_state
    assert step.lower(state, batch, key) is not None


def test_tiny_config_is_valid_and_bad_overrides_raise():
    for variant in ("tiny", "smoke", "paper"):
        cfg_lib.validate_module_config(dlm_config.get_config(variant), dlm_config)
    with pytest.raises(ValueError, match="multiple of batch_size"):
        cfg_lib.validate_module_config(dlm_config.get_config("tiny,eval_windows=100"), dlm_config)
    with pytest.raises(ValueError, match="sampling.steps"):
        cfg_lib.validate_module_config(dlm_config.get_config("tiny,sampling.steps=(0,4)"),
                                       dlm_config)
    with pytest.raises(ValueError, match="evaluator.model.max_len"):
        cfg_lib.validate_module_config(dlm_config.get_config("tiny,seq_len=256"), dlm_config)
    with pytest.raises(ValueError, match="no field"):
        dlm_config.get_config("tiny,no_such_field=1")


def test_family_specs_take_the_tokenizers_ids_and_the_process_group():
    from core.data import ByteTokenizer

    tok, config = ByteTokenizer(), dlm_config.get_config("tiny")
    spec = family_spec(config, "esolm_nelbo", tok)
    assert (spec.vocab_size, spec.mask_id, spec.bos_id) == (tok.vocab_size, tok.mask_id,
                                                            tok.bos_id)
    assert spec.num_classes == tok.mask_id == 256
    assert spec.alpha0 == config.process.alpha0 and spec.t_min == config.process.t_min
    assert FamilySpec("mdlm") == family_spec(config, "mdlm", tok)  # defaults are the tokenizer's
