"""Loading a checkpoint sharded over a mesh as it loads (8 fake CPU devices, see Makefile)."""

import jax
import pytest

from core import sharding as shd
from core import testing
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
    testing.assert_same_model(sharded, single, vocab_size=64)
