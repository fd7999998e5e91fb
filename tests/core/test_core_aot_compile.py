"""core.aot: compile-only TPU and GPU devices on a CPU-only machine.

The compile tests (marker ``aot``) run in .venv-aot (``make test-aot``); the others run anywhere.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from core import aot

COMPILE = pytest.mark.aot


def _need(target):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env installs them)")


def test_unknown_target_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown compile target 'a100'.*h100.*h200.*tpu-v5e.*tpu-v6e"):
        aot.compile_only_device("a100")
    assert aot.target_names() == ("h100", "h200", "tpu-v5e", "tpu-v6e")


def test_missing_extras_is_one_line_naming_the_packages():
    missing = [t for t in aot.target_names() if not aot.extras_available(t)]
    if not missing:
        pytest.skip("every compile extra is installed in this environment")
    for t in missing:
        with pytest.raises(aot.CompileExtrasMissing) as e:
            aot.compile_only_device(t)
        msg = str(e.value)
        assert "\n" not in msg and "pip install" in msg and "make aot-env" in msg
        assert ("jax[tpu]" in msg) if t.startswith("tpu") else ("jax-cuda12-plugin" in msg)


def test_args_must_be_a_tuple_of_shaped_leaves():
    with pytest.raises(ValueError, match="tuple"):
        aot.compile_for(lambda x: x, jax.ShapeDtypeStruct((2,), jnp.float32), "h100")


@COMPILE
@pytest.mark.parametrize("target", ["tpu-v5e", "tpu-v6e", "h100", "h200"])
def test_compiles_on_one_device_with_exact_argument_bytes(target):
    _need(target)
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((128, 256), jnp.bfloat16)
    res = aot.compile_for(lambda x, w: jnp.tanh(x @ w.astype(jnp.float32)), (x, w), target)
    device = aot.compile_only_device(target)
    assert device.device_kind == aot.TARGETS[target].device_kind
    assert res.compiled.input_shardings[0][0] == jax.sharding.SingleDeviceSharding(device)
    # (64 * 128) f32 + (128 * 256) bf16: both already tile-aligned on every target
    assert res.memory["argument"] == 64 * 128 * 4 + 128 * 256 * 2
    assert res.memory["output"] == 64 * 256 * 4
    if target.startswith("tpu"):
        assert res.memory["generated_code"] > 0


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


@COMPILE
def test_tpu_compile_rejects_a_block_that_breaks_mosaic_tiling():
    """Interpret mode and lowering accept a (3, 100) block of a (6, 200) array; Mosaic does not."""
    _need("tpu-v5e")
    f = pl.pallas_call(_copy_kernel, grid=(2, 2), in_specs=[pl.BlockSpec((3, 100), lambda i, j: (i, j))],
                       out_specs=pl.BlockSpec((3, 100), lambda i, j: (i, j)),
                       out_shape=jax.ShapeDtypeStruct((6, 200), jnp.float32))
    x = jax.ShapeDtypeStruct((6, 200), jnp.float32)
    with pytest.raises(Exception, match=r"(?i)block|tiling|divisible|shape"):
        aot.compile_for(f, (x,), "tpu-v5e")
    # the aligned version compiles
    g = pl.pallas_call(_copy_kernel, grid=(1, 2), in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                       out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                       out_shape=jax.ShapeDtypeStruct((8, 256), jnp.float32))
    aot.compile_for(g, (jax.ShapeDtypeStruct((8, 256), jnp.float32),), "tpu-v5e")


def _matmul_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


@COMPILE
def test_gpu_compile_rejects_a_kernel_over_the_shared_memory_limit():
    """A Triton dot of two [m, m] f32 tiles needs 8 m^2 bytes of shared memory: m = 64 fits in
    the H100's 232448 bytes, m = 512 (2 MiB) does not, and only the compiler says so."""
    _need("h100")

    def call(m):
        spec = pl.BlockSpec((m, m), lambda i: (0, 0))
        return pl.pallas_call(_matmul_kernel, grid=(1,), in_specs=[spec, spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct((m, m), jnp.float32),
                              compiler_params=pl_triton.CompilerParams(num_warps=4))

    small = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    aot.compile_for(call(64), (small, small), "h100")
    big = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    with pytest.raises(Exception, match="Shared memory size limit exceeded"):
        aot.compile_for(call(512), (big, big), "h100")


@COMPILE
def test_static_keyword_arguments_reach_a_jitted_function():
    _need("h100")

    @functools.partial(jax.jit, static_argnames=("power",))
    def f(x, power):
        return x ** power

    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    res = aot.compile_for(f, (x,), "h100", kwargs={"power": 3})
    assert res.memory["output"] == 8 * 8 * 4


class _Lowered:
    """A stand-in for ``jax.stages.Lowered`` that refuses its first compiles with ``messages``,
    one each."""

    def __init__(self, *messages):
        self.messages, self.calls = messages, []

    def compile(self, compiler_options=None):
        self.calls.append(compiler_options)
        if len(self.calls) <= len(self.messages):
            raise jax.errors.JaxRuntimeError(self.messages[len(self.calls) - 1])
        return "compiled"


def test_compile_lowered_retries_once_with_the_platforms_fallback():
    tile = "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.62 = f32[28,512]"
    lowered = _Lowered(tile)
    compiled, fallback = aot.compile_lowered(lowered, "cuda")
    assert compiled == "compiled" and fallback is aot.FALLBACKS[0]
    assert lowered.calls == [None, {"xla_gpu_enable_triton_gemm": False}]
    assert "Triton GEMM" in fallback.reason and "\n" not in fallback.reason
    # the same symptom on another platform, or another error, is not retried
    for platform, message in (("tpu", tile), ("cuda", "RESOURCE_EXHAUSTED: out of memory")):
        with pytest.raises(jax.errors.JaxRuntimeError):
            aot.compile_lowered(_Lowered(message), platform)
    # options the caller already passed are kept, and a fallback already in them is not retried
    lowered = _Lowered(tile)
    aot.compile_lowered(lowered, "cuda", {"xla_dump_to": "d"})
    assert lowered.calls[1] == {"xla_dump_to": "d", "xla_gpu_enable_triton_gemm": False}
    with pytest.raises(jax.errors.JaxRuntimeError):
        aot.compile_lowered(_Lowered(tile), "cuda", {"xla_gpu_enable_triton_gemm": False})


def test_compile_lowered_chains_fallbacks_a_program_needs_one_after_another():
    tile = "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.62 = f32[28,512]"
    cub = "INTERNAL: CUDA Runtime error: : cudaErrorInvalidDevice: invalid device ordinal"
    lowered = _Lowered(tile, cub)
    compiled, fallback = aot.compile_lowered(lowered, "cuda")
    both = {"xla_gpu_enable_triton_gemm": False, "xla_gpu_enable_cub_radix_sort": False}
    assert compiled == "compiled"
    assert lowered.calls == [None, {"xla_gpu_enable_triton_gemm": False}, both]
    assert fallback.options == both and "Triton GEMM" in fallback.reason and "CUB" in fallback.reason
    # the same symptom again once its options are in force is XLA's error, not a loop
    with pytest.raises(jax.errors.JaxRuntimeError, match="cudaErrorInvalidDevice"):
        aot.compile_lowered(_Lowered(cub, cub), "cuda")


@COMPILE
def test_a_large_sort_compiles_for_h100_with_xlas_own_sort_kernel():
    """XLA:GPU turns a 50k-key sort into a CUB radix sort whose scratch is sized through the CUDA
    runtime, which a compile-only H100 lacks ("cudaErrorInvalidDevice", as the GRPO step's
    permutation of its problem pool did); the fallback compiles it with XLA's sort."""
    _need("h100")
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    res = aot.compile_for(lambda k: jax.random.permutation(k, 50_000), (key,), "h100")
    assert res.fallback is not None
    assert res.fallback.options == {"xla_gpu_enable_cub_radix_sort": False}
    assert res.memory["output"] == 50_000 * 4
    assert aot.compile_for(lambda k: jax.random.permutation(k, 1000), (key,), "h100").fallback is None


def test_install_command_and_require_extras_name_the_packages():
    assert aot.install_command("tpu") == f'pip install "jax[tpu]=={jax.__version__}"'
    assert f"jax-cuda12-plugin=={jax.__version__}" in aot.install_command("cuda")
    with pytest.raises(ValueError, match="platform 'rocm'"):
        aot.install_command("rocm")
    with pytest.raises(ValueError, match="unknown compile target 'v4'"):
        aot.require_extras("v4")
    assert aot.target("h200").spec == "h200.txtpb" and (aot.TARGET_DIR / "h200.txtpb").exists()


@COMPILE
@pytest.mark.parametrize("target", ["h100", "h200"])
def test_gpu_fallback_options_move_float32_dots_from_triton_to_cublas(target):
    """The fallback's options change what XLA:GPU emits: by default a float32 dot with a fused
    producer becomes a Triton GEMM fusion (tiles normally chosen by autotuning on the device);
    with the fallback it is a cuBLASLt call."""
    import re

    _need(target)
    device = aot.compile_only_device(target)
    s = jax.sharding.SingleDeviceSharding(device)
    args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=s) for shape in ((256, 512), (512, 1024))]
    lowered = jax.jit(lambda x, w: jnp.tanh(x @ jnp.sin(w))).lower(*args)

    def calls(options):
        text = lowered.compile(compiler_options=options).as_text()
        return set(re.findall(r'(__triton_nested_gemm_fusion|__cublas\$lt\$matmul)', text))

    assert calls(None) == {"__triton_nested_gemm_fusion"}
    assert calls(aot.FALLBACKS[0].options) == {"__cublas$lt$matmul"}
