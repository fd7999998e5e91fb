"""Loading a checkpoint sharded over a mesh as it loads (8 fake CPU devices, see Makefile)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from core import sharding as shd
from models import hf_checkpoint as hfc

pytestmark = pytest.mark.multidevice
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_tensor_parallel_load_equals_single_device(tmp_path):
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(tmp_path))
    mesh = shd.make_mesh(model_parallelism=4)
    sharded = hfc.load_checkpoint(str(tmp_path), mesh=mesh)
    single = hfc.load_checkpoint(str(tmp_path))
    q = sharded.params["blocks"][0]["attn"]["q_proj"]["kernel"][...]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, shd.MODEL)
    assert q.addressable_shards[0].data.shape == (32, 8)  # each device holds a quarter
    down = sharded.params["blocks"][1]["mlp"]["down"]["kernel"][...]
    assert down.sharding.spec == jax.sharding.PartitionSpec(shd.MODEL, None)
    for a, b in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = jnp.asarray(np.arange(24)[None] % 64)
    got = jax.jit(lambda p: nnx.merge(sharded.graphdef, p)(ids))(sharded.params)
    want = nnx.merge(single.graphdef, single.params)(ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(jnp.abs(want).max()))
