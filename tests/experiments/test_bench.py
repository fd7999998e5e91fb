"""Benchmarks: discovery, the module interface, the no-cache rollout baseline, and smoke runs
through ``run_all`` (numbers meaningless; only the structure and the ratios' presence are checked)."""

import importlib
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import flagsaver
from flax import nnx

from algorithms.rl_scaling import rollout
from core.timing import best_seconds
from experiments.bench import rl_rollouts, run_all
from experiments.bench.timing import SIZE_NAMES
from models.transformer import Transformer, TransformerConfig

EXPECTED = {"decode", "judge_btl", "kv_quant", "rl_rollouts", "sparse_decode"}
RATIO = re.compile(r"\| \d+(\.\d+)?x \|")  # a ratio cell such as "| 2.3x |"


def test_discovery_finds_every_benchmark_and_no_helper():
    names = run_all.discover()
    assert EXPECTED <= set(names), names
    assert not {"run_all", "timing", "__init__"} & set(names)
    assert names == sorted(names)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_module_exposes_run_and_sizes_and_rejects_unknown_size(name):
    mod = importlib.import_module(f"experiments.bench.{name}")
    assert callable(mod.run)
    assert set(mod.SIZES) == set(SIZE_NAMES)
    with pytest.raises(ValueError, match="unknown size 'huge'"):
        mod.run(size="huge")


def test_best_seconds_calls_each_function_warmup_plus_repeats_times_and_keeps_the_minimum():
    # each function moves a fake clock by its cost, so the times are exact whatever the load
    now, calls, order = [0.0], {"slow": 0, "fast": 0}, []

    def make(name, seconds):
        def fn():
            calls[name] += 1
            order.append(name)
            now[0] += seconds if calls[name] != 4 else 3 * seconds  # one disturbed call
            return jnp.zeros(())
        return fn

    t = best_seconds({"slow": make("slow", 0.5), "fast": make("fast", 0.125)}, repeats=3,
                     warmup=2, clock=lambda: now[0])
    assert calls == {"slow": 5, "fast": 5}
    assert t == {"slow": 0.5, "fast": 0.125}
    # the warm-up calls first, then rounds that alternate the order
    assert order == ["slow", "slow", "fast", "fast", "slow", "fast", "fast", "slow", "slow", "fast"]
    with pytest.raises(ValueError, match="repeats >= 1"):
        best_seconds({"f": lambda: 0}, repeats=0)


def test_recompute_baseline_samples_what_the_cached_rollout_samples():
    # A 4-token vocabulary, so that the end token is sampled often and rows stop at different steps.
    cfg = TransformerConfig(vocab_size=4, max_len=10, d_model=16, num_layers=1, num_heads=2,
                            mlp_dim=32)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(3)))
    prompts = jax.random.randint(jax.random.key(0), (16, 4), 0, 4)
    kw = dict(max_new_tokens=6, end_id=1, temperature=1.0)
    key = jax.random.key(5)
    cached = jax.jit(lambda p: rollout.rollout(gd, p, prompts, key, **kw))(params)
    full = jax.jit(lambda p: rl_rollouts.recompute_rollout(gd, p, prompts, key, **kw))(params)
    toks, mask = np.asarray(cached[0]), np.asarray(cached[2])
    assert (toks == 1).any(axis=1).sum() >= 4 and not mask.all()  # the end-token path is exercised
    chex.assert_trees_all_equal(cached[0], full[0])
    chex.assert_trees_all_equal(cached[2], full[2])
    chex.assert_trees_all_close(cached[1], full[1], atol=1e-5)
    with pytest.raises(ValueError, match="max_new_tokens >= 1"):
        rl_rollouts.recompute_rollout(gd, params, prompts, key, max_new_tokens=0, end_id=1)


@pytest.mark.slow
def test_rl_rollouts_smoke_reports_ratios_and_identical_tokens():
    md = rl_rollouts.run(size="smoke")
    assert md.startswith("## rl_rollouts")
    assert len(RATIO.findall(md)) == 4  # baseline and KV cache, two completion lengths
    assert md.count("| 1.000 |") == 2  # same tokens in both samplers
    assert "python -m experiments.bench.rl_rollouts smoke" in md


def _run_all(tmp_path, only="decode", size="smoke"):
    """run_all.main in this process with its flags set (and restored afterwards)."""
    out = tmp_path / "bench.md"
    with flagsaver.as_parsed((run_all._OUT, str(out)), (run_all._ONLY, only), (run_all._SIZE, size)):
        return run_all.main([]), out


def test_run_all_writes_the_file_with_machine_note_table_and_command(tmp_path):
    code, out = _run_all(tmp_path)
    assert code == 0
    md = out.read_text()
    assert md.startswith("# Benchmarks")
    assert re.search(r"^Machine: .*JAX \d", md, re.M)
    assert "only ratios measured in the same run are meaningful" in md
    assert "## decode:" in md and "Same tokens: True" in md
    assert len(RATIO.findall(md)) == 2
    assert "`python -m experiments.bench.decode smoke`" in md


def test_run_all_only_keeps_the_other_sections_of_the_file(tmp_path):
    """A rerun of one benchmark replaces its own section and keeps the others, in discovery order."""
    out = tmp_path / "bench.md"
    out.write_text("# Benchmarks\n\nold header\n\n## judge_btl: old fit\n\nold table 1\n\n"
                   "_judge_btl: 3 s._\n\n## decode: old decode\n\nold table 2\n\n"
                   "## sparse_decode: old FFD\n\nnote kept\n")
    code, _ = _run_all(tmp_path, only="decode")
    assert code == 0
    md = out.read_text()
    assert "old decode" not in md and "old table 2" not in md and "Same tokens: True" in md
    assert "## judge_btl: old fit\n\nold table 1\n\n_judge_btl: 3 s._" in md
    assert "## sparse_decode: old FFD\n\nnote kept" in md
    assert md.index("## decode:") < md.index("## judge_btl:") < md.index("## sparse_decode:")
    assert "old header" not in md  # the header is rewritten for this run


@pytest.mark.parametrize("only, size, msg", [("decode", "huge", "unknown size 'huge'"),
                                             ("nope", "smoke", "unknown benchmarks ['nope']")])
def test_run_all_rejects_unknown_size_and_benchmark(tmp_path, capsys, only, size, msg):
    code, out = _run_all(tmp_path, only, size)
    assert code == 2 and msg in capsys.readouterr().err
    assert not out.exists()
