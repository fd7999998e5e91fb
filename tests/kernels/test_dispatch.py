"""kernels.dispatch: the one implementation choice of every op (sparse_decode and kv_quant): the
tables (functions, platforms, ``supports`` hooks), ``"auto"`` per platform, one refusal wording
for both ops (what was asked, where, what is available on the platform), and one shape check."""

import dataclasses
import inspect
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
                            interpret=True).name == "pallas_gpu"
    assert dispatch.call_platform(jnp.ones(2)) == jax.default_backend()
    seen = []
    jax.jit(lambda x: seen.append(dispatch.call_platform(x)) or x)(jnp.ones(2))
    assert seen == [None]  # traced: the program may be compiled for another platform
    # with no platform only the name is checked
    assert dispatch.resolve(kq.TABLE, "pallas_tpu", "here", entry=kq.QVG).name == "pallas_tpu"


def test_a_table_refuses_duplicate_names_and_unknown_auto_entries():
    impl = dispatch.Implementation("xla", abs)
    with pytest.raises(ValueError, match="distinct"):
        dispatch.Table("op", (impl, impl), {"*": ("xla",)})
    with pytest.raises(ValueError, match="auto must map"):
        dispatch.Table("op", (impl,), {"*": ("pallas_tpu",)})
    with pytest.raises(ValueError, match="auto must map"):
        dispatch.Table("op", (impl,), {"tpu": ("xla",)})
    with pytest.raises(ValueError, match="share their platforms"):
        dispatch.Table("op", (dispatch.Implementation("k", abs, ("tpu",), entry="A"),
                              dispatch.Implementation("k", abs, ("gpu",), entry="B")),
                       {"*": ("k",)})
    with pytest.raises(ValueError, match="entry point or none"):
        dispatch.Table("op", (dispatch.Implementation("k", abs, entry="A"),
                              dispatch.Implementation("j", abs)), {"*": ("k",)})


def test_an_implementation_refuses_a_bad_name_function_or_platform():
    with pytest.raises(ValueError, match="name"):
        dispatch.Implementation("", abs)
    with pytest.raises(ValueError, match="fn.*callable"):
        dispatch.Implementation("xla", "xla")
    with pytest.raises(ValueError, match="supports.*callable"):
        dispatch.Implementation("xla", abs, supports=None)
    with pytest.raises(ValueError, match="platforms"):
        dispatch.Implementation("xla", abs, ("cuda",))


def test_the_tables_hold_the_functions_each_name_calls():
    from kernels.kv_quant import pallas_gpu, pallas_tpu, xla
    from kernels.kv_quant import reference as kq_ref

    assert kq.TABLE.get("pallas_tpu", kq.QVG).fn is pallas_tpu.qvg_chunk_attention
    assert kq.TABLE.get("pallas_gpu", kq.QVG).fn is pallas_gpu.qvg_chunk_attention
    assert kq.TABLE.get("xla", kq.KIVI).fn is xla.kivi_attention
    assert kq.TABLE.get("reference", kq.KIVI).fn is kq_ref.kivi_cache_attention_reference
    assert kq.TABLE.get("pallas_tpu", kq.KIVI) is None
    assert len({sd.TABLE.get(n).fn for n in sd.TABLE.names}) == 4  # one function per name
    assert sd.TABLE.entries == (None,) and kq.TABLE.entries == (kq.QVG, kq.KIVI)


def test_a_call_runs_the_function_its_table_holds(monkeypatch):
    """The entry point calls the resolved entry's ``fn`` (a table with a stand-in for
    ("reference", QVG)), with the QVG calling convention."""
    seen = []
    table = dispatch.Table("kv_quant", tuple(
        dataclasses.replace(i, fn=lambda *a, **k: seen.append(k) or "ran")
        if (i.name, i.entry) == ("reference", kq.QVG) else i for i in kq.TABLE.implementations),
        kq.TABLE.auto)
    monkeypatch.setattr(kq, "TABLE", table)
    assert kq.qvg_chunk_attention(*_qvg_args(), implementation="reference") == "ran"
    assert seen == [{"interpret": False}]


def test_auto_is_the_one_default_of_both_ops():
    for fn in (sd.ffd_decode, kq.qvg_chunk_attention, kq.kivi_attention):
        assert inspect.signature(fn).parameters["implementation"].default == "auto"
    from kernels.sparse_decode.cache import FFDCache

    for cls in (FFDCache, QVGCache, KIVICache):
        assert cls().implementation == "auto"


def test_one_shape_check_for_both_ops():
    """Same signature for both ops: (table, name, shapes, where, entry=, platform=); None from the
    supports hook passes, a reason is raised after the caller's name; other names pass any
    shape."""
    dispatch.check_kernel_shape(sd.TABLE, "pallas_gpu", {"group": 16, "page_size": 16}, "here")
    with pytest.raises(ValueError, match=r"^here: implementation 'pallas_gpu' tiles pages .*page "
                                         r"size 8; use such a page size or implementation='xla'"):
        dispatch.check_kernel_shape(sd.TABLE, "pallas_gpu", {"group": 4, "page_size": 8}, "here")
    with pytest.raises(ValueError, match="at most 16 query heads per kv head, got 32"):
        dispatch.check_kernel_shape(sd.TABLE, "pallas_gpu", {"group": 32, "page_size": 16}, "x")
    dispatch.check_kernel_shape(kq.TABLE, "pallas_gpu", {"chunk": 64, "head_dim": 128}, "here",
                                entry=kq.QVG)
    with pytest.raises(ValueError, match=r"^here: the GPU kernel .*got chunk 96"):
        dispatch.check_kernel_shape(kq.TABLE, "pallas_gpu", {"chunk": 96, "head_dim": 128},
                                    "here", entry=kq.QVG)
    for table, shapes in ((sd.TABLE, {"group": 32, "page_size": 8}),
                          (kq.TABLE, {"chunk": 96, "head_dim": 96})):
        for name in ("reference", "xla", "pallas_tpu"):
            dispatch.check_kernel_shape(table, name, shapes, "here")
    with pytest.raises(ValueError, match="implementation 'cuda' is not available"):
        dispatch.check_kernel_shape(sd.TABLE, "cuda", {"group": 1, "page_size": 16}, "here")


def test_auto_never_swaps_to_another_kernel_for_a_shape(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ValueError, match="page size 8"):
        dispatch.resolve(sd.TABLE, "auto", "here", shapes={"group": 1, "page_size": 8})
    assert dispatch.resolve(sd.TABLE, "xla", "here", shapes={"group": 1, "page_size": 8}).name \
        == "xla"
    assert dispatch.resolve(sd.TABLE, None, "here", shapes={"group": 1, "page_size": 16}).name \
        == "pallas_gpu"


def test_backend_modules_are_those_of_every_registered_op():
    from models import kv_cache

    assert kv_cache.BACKEND_MODULES == dispatch.backend_modules() == tuple(
        f"kernels.{op}.{m}" for op in dispatch.OPS for m in ("cache", "sharded"))
    assert set(dispatch.OPS) == {"sparse_decode", "kv_quant"}
