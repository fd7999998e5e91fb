"""Loading a GGUF file sharded over a mesh as it loads (8 fake CPU devices, see Makefile)."""

import jax
import numpy as np
import pytest

from core import sharding as shd
from core import testing
from models import gguf_checkpoint as gc

pytestmark = pytest.mark.multidevice
gguf = pytest.importorskip("gguf")


def _tiny_gguf(path) -> str:
    """A random 2-layer llama (E 64, 4 heads, 2 kv heads, F 96, V 64), matrices Q8_0."""
    rng = np.random.default_rng(0)
    e, f, h, k, d, v = 64, 96, 4, 2, 16, 64
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("llama.context_length", 64), ("llama.embedding_length", e),
                       ("llama.block_count", 2), ("llama.feed_forward_length", f),
                       ("llama.attention.head_count", h), ("llama.attention.head_count_kv", k)):
        w.add_uint32(key, value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    shapes = {"token_embd.weight": (v, e), "output_norm.weight": (e,)}
    for i in range(2):
        shapes |= {f"blk.{i}.attn_norm.weight": (e,), f"blk.{i}.ffn_norm.weight": (e,),
                   f"blk.{i}.attn_q.weight": (h * d, e), f"blk.{i}.attn_k.weight": (k * d, e),
                   f"blk.{i}.attn_v.weight": (k * d, e), f"blk.{i}.attn_output.weight": (e, h * d),
                   f"blk.{i}.ffn_gate.weight": (f, e), f"blk.{i}.ffn_up.weight": (f, e),
                   f"blk.{i}.ffn_down.weight": (e, f)}
    for name, shape in shapes.items():
        x = rng.normal(0, 0.2, shape).astype(np.float32)
        if len(shape) == 1:
            w.add_tensor(name, 1 + x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_tensor_parallel_gguf_load_equals_single_device(tmp_path):
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    mesh = shd.make_mesh(model_parallelism=4)
    sharded = gc.load_checkpoint(path, mesh=mesh)
    single = gc.load_checkpoint(path)
    q = sharded.params["blocks"][0]["attn"]["q_proj"]["kernel"][...]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, shd.MODEL)
    assert q.addressable_shards[0].data.shape == (64, 16)  # each device holds a quarter
    testing.assert_same_model(sharded, single, vocab_size=64)
