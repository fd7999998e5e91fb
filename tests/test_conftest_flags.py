"""The XLA flags the suite compiles with (tests/conftest.py): what is added, what the caller keeps."""

import os
from importlib import metadata

from tests.conftest import selects_compile_tests, suite_xla_flags

LEVEL0 = "--xla_backend_optimization_level=0"
LOOP = "--xla_cpu_use_fusion_emitters=false"


def test_checked_jaxlib_gets_level_0_and_the_loop_emitter():
    assert suite_xla_flags("", "0.10.2").split() == [LEVEL0, LOOP]
    assert suite_xla_flags("--xla_force_host_platform_device_count=8", "0.10.0").split() == [
        "--xla_force_host_platform_device_count=8", LEVEL0, LOOP]


def test_caller_flags_win():
    assert suite_xla_flags("--xla_backend_optimization_level=2", "0.10.2").split() == [
        "--xla_backend_optimization_level=2", LOOP]
    assert suite_xla_flags("--xla_cpu_use_fusion_emitters=true", "0.10.2").split() == [
        "--xla_cpu_use_fusion_emitters=true", LEVEL0]


def test_unchecked_jaxlib_keeps_xla_default_emitters():
    # XLA aborts on a flag it does not know: the loop-emitter flag only where it was checked
    assert suite_xla_flags("", "0.11.0").split() == [LEVEL0]
    assert suite_xla_flags("", "0.1.0").split() == [LEVEL0]


def test_this_run_compiles_as_the_conftest_says():
    flags = os.environ["XLA_FLAGS"].split()
    assert any(f.startswith("--xla_backend_optimization_level=") for f in flags)
    if metadata.version("jaxlib").startswith("0.10."):
        assert any(f.startswith("--xla_cpu_use_fusion_emitters=") for f in flags)


def test_compile_test_selections_keep_xla_defaults():
    for expr in ("aot", " aot ", "aot and not slow", "slow or aot", "(aot)"):
        assert selects_compile_tests(expr), expr
    for expr in ("", "not aot", "not multidevice and not aot", "not  aot", "multidevice", "aotx"):
        assert not selects_compile_tests(expr), expr
