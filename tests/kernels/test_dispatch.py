"""kernels.dispatch: the one implementation choice of every op (sparse_decode and kv_quant): the
tables, ``"auto"`` per platform, and one refusal wording for both ops (what was asked, where, what
is available on the platform)."""

import re

import jax
import jax.numpy as jnp
import pytest

from kernels import dispatch
from kernels.kv_quant import api as kq
from kernels.kv_quant.cache import KIVICache, QVGCache
from kernels.kv_quant.reference import QVGConfig
from kernels.sparse_decode import api as sd
from kernels.sparse_decode import reference as sd_ref


def _refusal(where, asked, platform, available, op, entry=None):
    """The shared message, as a regex: where, what was asked, the platform, what is available."""
    on = ("" if entry is None else f" for {entry}") + (
        "" if platform is None else f" on platform '{platform}'")
    return (rf"^{where}: implementation '{asked}' is not available{re.escape(on)}; expected None, "
            rf"'auto' or one of {re.escape(repr(available))} \({op} implementations: reference "
            r"\(cpu, gpu, tpu\); xla \(cpu, gpu, tpu\); pallas_tpu \(tpu; any platform with "
            r"interpret=True")


def test_both_ops_have_one_table_of_the_same_names():
    assert sd.TABLE.names == kq.TABLE.names == ("reference", "xla", "pallas_tpu", "pallas_gpu")
    assert sd.IMPLEMENTATIONS == sd.TABLE.names and kq.IMPLEMENTATIONS == kq.TABLE.names
    tpu = sd.TABLE.get("pallas_tpu")
    assert tpu.supported_on("tpu") and not tpu.supported_on("cpu") and not tpu.supported_on("gpu")
    assert tpu.supported_on("cpu", interpret=True)
    assert all(sd.TABLE.get(n).supported_on(p) for n in ("reference", "xla")
               for p in dispatch.PLATFORMS)
    assert kq.TABLE.available("cpu", kq.KIVI, interpret=True) == ("reference", "xla")
    assert kq.TABLE.available("cpu", kq.QVG, interpret=True) == kq.TABLE.names


@pytest.mark.parametrize("platform, ffd, qvg, kivi", [
    ("cpu", "xla", "xla", "xla"), ("tpu", "pallas_tpu", "pallas_tpu", "xla"),
    ("gpu", "pallas_gpu", "pallas_gpu", "xla")])
def test_auto_by_platform(monkeypatch, platform, ffd, qvg, kivi):
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    assert sd.resolve_implementation(None) == sd.default_implementation() == ffd
    assert kq.resolve_implementation("auto") == qvg
    assert kq.resolve_implementation(None, "kivi_attention", kq.KIVI) == kivi


def _ffd_args():
    cache = sd_ref.init_ffd_cache(1, 32, 1, 16, jnp.float32, 16)
    return jax.random.normal(jax.random.key(0), (1, 2, 16)), cache, jnp.array([5], jnp.int32)


def _qvg_args():
    cfg = QVGConfig(bits=2, stages=1, block=16, num_centroids=2, chunk=16, kmeans_iters=1)
    cache = QVGCache(config=cfg, implementation="xla").init(1, 32, 1, 16, jnp.float32)
    q = jax.random.normal(jax.random.key(1), (1, 1, 2, 16))
    n = jnp.array([16], jnp.int32)
    return (q, cache["k"], cache["v"], cfg, n, n, 1, None)


@pytest.mark.parametrize("asked", ["pallas_tpu", "pallas_gpu"])
def test_a_pallas_kernel_off_its_platform_is_refused_alike_by_both_ops(asked):
    if jax.default_backend() != "cpu":
        pytest.skip("the refusal is of a Pallas kernel on a CPU")
    with pytest.raises(ValueError, match=_refusal("ffd_decode", asked, "cpu", ("reference", "xla"),
                                                  "sparse_decode")):
        sd.ffd_decode(*_ffd_args(), implementation=asked)
    with pytest.raises(ValueError, match=_refusal("qvg_chunk_attention", asked, "cpu",
                                                  ("reference", "xla"), "kv_quant", "QVG")):
        kq.qvg_chunk_attention(*_qvg_args(), implementation=asked)


def test_unknown_names_are_refused_alike_by_both_ops():
    names = ("reference", "xla", "pallas_tpu", "pallas_gpu")
    with pytest.raises(ValueError, match=_refusal("FFDCache", "cuda", None, names,
                                                  "sparse_decode")):
        sd.resolve_implementation("cuda", "FFDCache")
    with pytest.raises(ValueError, match=_refusal("QVGCache", "cuda", None, names, "kv_quant",
                                                  "QVG")):
        QVGCache(implementation="cuda")


def test_kivi_refuses_the_qvg_only_kernels_by_name():
    with pytest.raises(ValueError, match=_refusal("KIVICache", "pallas_gpu", None,
                                                  ("reference", "xla"), "kv_quant", "KIVI")):
        KIVICache(implementation="pallas_gpu")
    assert "QVG only" in kq.TABLE.describe()


def test_interpret_mode_and_traced_calls_pass_the_platform_check():
    assert dispatch.resolve(sd.TABLE, "pallas_gpu", "here", platform="cpu",
                            interpret=True) == "pallas_gpu"
    assert dispatch.call_platform(jnp.ones(2)) == jax.default_backend()
    seen = []
    jax.jit(lambda x: seen.append(dispatch.call_platform(x)) or x)(jnp.ones(2))
    assert seen == [None]  # traced: the program may be compiled for another platform
    # with no platform only the name is checked
    assert dispatch.resolve(kq.TABLE, "pallas_tpu", "here", entry=kq.QVG) == "pallas_tpu"


def test_a_table_refuses_duplicate_names_and_unknown_auto_entries():
    impl = dispatch.Implementation("xla")
    with pytest.raises(ValueError, match="distinct"):
        dispatch.Table("op", (impl, impl), {"*": ("xla",)})
    with pytest.raises(ValueError, match="auto must map"):
        dispatch.Table("op", (impl,), {"*": ("pallas_tpu",)})
    with pytest.raises(ValueError, match="auto must map"):
        dispatch.Table("op", (impl,), {"tpu": ("xla",)})
