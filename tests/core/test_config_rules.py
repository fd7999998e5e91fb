"""Config schemas: every field of every experiment config has a type in its module's ``Config``,
every variant passes, and bad values are refused with one ValueError naming the field
(core.config.validate)."""

import dataclasses
import importlib
import math
import sys
import typing
from typing import Annotated, Literal

import ml_collections
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import config as cfg_lib
from core import report
from experiments import registry
from tests.experiments import forked_cli
from tests.hypothesis_budget import examples

MODULES = {name: importlib.import_module(f"experiments.configs.{name}")
           for name in registry.EXPERIMENTS}

VARIANT_CASES = [(name, v) for name, m in MODULES.items() for v in m.VARIANTS]


def _leaves(config):
    return [p for p in cfg_lib.field_paths(config) if p != "variant"
            and not isinstance(cfg_lib.get_field(config, p), ml_collections.ConfigDict)]


def _type(module, path):
    """The type of the dotted field path ``path`` in ``module.Config``."""
    schema = module.Config
    *groups, leaf = path.split(".")
    for group in groups:
        schema = typing.get_type_hints(schema, include_extras=True)[group]
    return typing.get_type_hints(schema, include_extras=True)[leaf]


def _with(config, path, value):
    """A copy of ``config`` with ``path`` set to ``value`` (of any type, as absl or a user's
    code could leave it)."""
    c = config.copy_and_resolve_references()
    *parents, leaf = path.split(".")
    node = c
    for p in parents:
        node = node[p]
    with node.ignore_type():
        node[leaf] = value
    return c


def _refused(name, config, path):
    """Validates; returns the message, which must name ``path``."""
    with pytest.raises(ValueError) as info:
        cfg_lib.validate_module_config(config, MODULES[name])
    message = str(info.value)
    assert "\n" not in message
    assert path in message, message
    return message


# -- every field has a type; every shipped variant is valid -------------------------------------

@pytest.mark.parametrize("name, variant", VARIANT_CASES)
def test_every_variant_passes_and_builds_its_schema(name, variant):
    module = MODULES[name]
    config = module.get_config(variant)
    built = cfg_lib.validate_module_config(config, module)
    assert isinstance(built, module.Config)
    plain = {k: v for k, v in config.to_dict().items() if k != "variant"}
    assert dataclasses.asdict(built) == plain  # every field, with the config's values
    assert not cfg_lib.field_problems(module.Config, config)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_experiment_states_its_claim_with_checks_on_its_metrics(name):
    config = MODULES[name].get_config("tiny")
    assert "claim" in config, f"{name}: config.claim (a core.report.Claim group) is missing"
    claim = report.Claim.from_config(config.claim)  # parses every check
    assert claim.statement and claim.checks
    bad = config.copy_and_resolve_references()
    bad.claim.checks = ("nonsense <",)
    with pytest.raises(ValueError, match="config field 'claim.checks'"):
        cfg_lib.validate_module_config(bad, MODULES[name])


# -- the bad inputs that used to fail deep in a run or with the wrong cause ----------------------

@pytest.mark.parametrize("name, path, value", [
    ("lm", "eval_windows", 0), ("lm", "batch_size", 0), ("lm", "seq_len", 0),
    ("lm", "steps", 0), ("lm", "learning_rate", -1.0), ("lm", "steps", "abc"),
    ("lm", "steps", True), ("lm", "steps", 2.5), ("lm", "model.d_model", -1),
    ("lm", "model.dtype", "float33"), ("lm", "model.attention", None),
    ("lm", "learning_rate", math.nan), ("lm", "grad_clip", math.inf),
    ("lm", "val_fraction", 1.0), ("diffusion_lm", "eval_windows", 0),
    ("diffusion_lm", "sizes", ()), ("diffusion_lm", "sizes", ((8, 1, 1), (12, 1), (16, 1, 1))),
    ("diffusion_lm", "families", ("ar", "bert")), ("diffusion_lm", "eps", 0.0),
    ("sparse_decode", "page_size", 0), ("sparse_decode", "max_density", 0.0),
    ("sparse_decode", "contexts", ()), ("sparse_decode", "lm_config", "huge"),
    ("sparse_decode", "lm_config", "smoke,steps=0"), ("kv_quant", "windows", 0),
    ("kv_quant", "bits", 3), ("kv_quant", "entrokv_pool", 4), ("kv_quant", "bits", 2.0),
    ("benchmark_game", "num_deltas", 0), ("benchmark_game", "theta", ()),
    ("benchmark_game", "rewards", "winner_takes_all"), ("spf", "step_grid", ()),
    ("spf", "problems", ("lsq_drift",)), ("spf", "progress", 1), ("spf", "dt", math.nan),
    ("forecasting", "horizons", (-5,)), ("forecasting", "horizons", ()),
    ("forecasting", "arima_order", (2, 0)), ("forecasting", "split", "random"),
    ("judge_btl", "cv_folds", 1), ("judge_btl", "heldout_fraction", 1.0),
    ("judge_btl", "heldout_fraction", 0.0), ("judge_btl", "level", 95.0),
    ("judge_btl", "columns.judge", ""), ("judge_btl", "drop_unknown_outcomes", "yes"),
    ("rl_scaling", "ns", (2, 4)), ("rl_scaling", "temperature", 0.0),
    ("rl_scaling", "warmup.easy_target", 0.0), ("rl_scaling", "aggregation", "sum"),
])
def test_bad_value_is_refused_naming_the_field(name, path, value):
    config = MODULES[name].get_config("smoke")
    message = _refused(name, _with(config, path, value), path)
    assert "expected" in message


@pytest.mark.parametrize("name", list(MODULES))
def test_every_field_refuses_values_of_no_kind_it_takes(name):
    """A sweep over every field: None, a value of another kind, nan and bool are refused."""
    config = MODULES[name].get_config("smoke")
    for path in _leaves(config):
        value = cfg_lib.get_field(config, path)
        bad = [None, object()]
        if isinstance(value, bool):
            bad += [0, 1, "True"]
        elif isinstance(value, int | float):
            bad += [math.nan, -math.inf, str(value), (value,)]
            if isinstance(value, int):  # (a float field stores True as 1.0: ml_collections casts)
                bad.append(True)
        elif isinstance(value, str):
            bad += [1, ("x",)]
        elif isinstance(value, tuple):
            bad += [value[0] if value else 1, "x", (None,), (math.nan,)]
        for b in bad:
            _refused(name, _with(config, path, b), path)


def test_all_refused_fields_are_named_in_one_line():
    config = _with(_with(MODULES["lm"].get_config("smoke"), "steps", 0), "batch_size", -1)
    message = _refused("lm", config, "steps")
    assert "'batch_size' = -1" in message and "'steps' = 0" in message


@pytest.mark.parametrize("name, overrides, names", [
    ("lm", {"model.num_heads": 4, "model.num_kv_heads": 3}, ("num_heads", "num_kv_heads")),
    ("lm", {"seq_len": 128}, ("seq_len", "model.max_len")),
    ("lm", {"model.d_model": 30}, ("d_model", "num_heads")),  # head dim 15: odd
    ("diffusion_lm", {"reference_size": 3}, ("reference_size", "sizes")),
    ("diffusion_lm", {"eval_windows": 9}, ("eval_windows", "batch_size")),
    ("diffusion_lm", {"families": ("mdlm", "duo")}, ("families",)),
    ("sparse_decode", {"num_heads": 12}, ("num_heads", "num_kv_heads")),
    ("sparse_decode", {"contexts": (2000,)}, ("contexts", "page_size")),
    ("sparse_decode", {"head_dim": 24}, ("head_dim",)),
    ("sparse_decode", {"greedy_new": 60}, ("greedy_prompt", "greedy_new")),
    ("kv_quant", {"prompt_len": 64}, ("prompt_len",)),
    ("kv_quant", {"chunk": 24}, ("chunk", "kivi_group")),
    ("kv_quant", {"qvg_block": 12}, ("qvg_block",)),
    ("rl_scaling", {"warmup.max_easy_steps": 8}, ("max_easy_steps", "max_steps")),
    ("rl_scaling", {"pass_k": 3}, ("pass_k", "sampled_eval")),
    ("rl_scaling", {"ns": (1, 2, 4)}, ("ns", "advantage")),
    ("forecasting", {"arima_seasonal_order": (1, 0, 0, 1)}, ("arima_seasonal_order",)),
    ("spf", {"omega_min": 2.0}, ("omega_min", "omega_max")),
    ("judge_btl", {"columns.tie_value": "left"}, ("left_value", "tie_value")),
])
def test_cross_field_checks(name, overrides, names):
    config = MODULES[name].get_config("smoke")
    for path, value in overrides.items():
        config = _with(config, path, value)
        assert not cfg_lib.field_problems(MODULES[name].Config, config)  # every field alone is valid
    with pytest.raises(ValueError) as info:
        cfg_lib.validate_module_config(config, MODULES[name])
    assert all(n in str(info.value) for n in names), str(info.value)


def test_sparse_decode_page_budget_is_what_the_report_states():
    """ceil(max_density * pages) must reach the XLA path's 2 pages in every context; the smallest
    accepted density for the smoke context (2048 / 128 = 16 pages) is exactly 2 / 16."""
    config = MODULES["sparse_decode"].get_config("smoke")
    pages = config.contexts[0] // config.page_size
    assert pages == 16
    cfg_lib.validate_module_config(_with(config, "max_density", 2 / pages), MODULES["sparse_decode"])
    below = np.nextafter(1 / pages, 0.0)  # ceil(below * 16) = 1 page: raised to 2 behind the report
    _refused("sparse_decode", _with(config, "max_density", float(below)), "max_density")
    # a density the report would print as 0%
    long = _with(_with(config, "contexts", (1 << 20,)), "max_density", 0.005)  # f"{0.005:.0%}": 0%
    assert "0%" in _refused("sparse_decode", long, "max_density")
    cfg_lib.validate_module_config(_with(long, "max_density", 0.006), MODULES["sparse_decode"])


# -- the types a field may have ------------------------------------------------------------------

def test_types_in_words_and_bounds():
    count = Annotated[int, cfg_lib.Range(1, 3)]
    assert [cfg_lib.refusal(count, v) is None for v in (0, 1, 3, 4, 2.0, True, np.int32(2))] == [
        False, True, True, False, False, False, True]
    assert cfg_lib.expected(count) == "an integer in [1, 3]"
    n = Annotated[float, cfg_lib.Range(0, 1, lo_open=True)]
    assert [cfg_lib.refusal(n, v) is None for v in (0, 0.0, 1e-300, 1, 1.0 + 1e-15, math.nan,
                                                    True)] == [
        False, False, True, True, False, False, False]
    assert cfg_lib.refusal(n, 2.0) == "a finite number in (0, 1]"
    assert cfg_lib.expected(cfg_lib.NonNegative) == "a finite number >= 0"
    assert cfg_lib.refusal(float, math.inf) and cfg_lib.refusal(float, -1e300) is None
    assert cfg_lib.expected(Literal[2, "x"]) == "one of 2, 'x'"
    assert cfg_lib.refusal(Literal[2, "x"], 2.0) and cfg_lib.refusal(Literal[2, "x"], True)
    assert cfg_lib.expected(int | Literal["auto"]) == "an integer or one of 'auto'"
    assert cfg_lib.refusal(int | Literal["auto"], "auto") is None


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(-50, 50), st.integers(-1000, 1000))
def test_integer_bound_accepts_exactly_the_integers_in_range(lo, value):
    tp = Annotated[int, cfg_lib.Range(lo)]
    assert (cfg_lib.refusal(tp, value) is None) == (value >= lo)
    assert cfg_lib.refusal(tp, float(value))  # 3.0 is not an integer field's value


@settings(max_examples=examples(60), deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.booleans())
def test_number_bounds_open_and_closed(x, lo_open, hi_open):
    tp = Annotated[float, cfg_lib.Range(-1.0, 1.0, lo_open=lo_open, hi_open=hi_open)]
    inside = math.isfinite(x) and (-1 < x if lo_open else -1 <= x) and (x < 1 if hi_open else x <= 1)
    assert (cfg_lib.refusal(tp, x) is None) == inside


def test_tuples_strings_and_rules():
    t = Annotated[tuple[cfg_lib.Count, ...], cfg_lib.Items(2, 3)]
    ok = [cfg_lib.refusal(t, v) is None for v in ((1, 2), [1, 2, 3], (1,), (1, 2, 3, 4), (1, 0),
                                                  "12")]
    assert ok == [True, True, False, False, False, False]
    assert cfg_lib.expected(t) == "a tuple of 2 to 3 items, each an integer >= 1"
    assert cfg_lib.expected(tuple[int, ...]) == "a tuple of >= 1 item, each an integer"
    assert cfg_lib.refusal(tuple[int, ...], ()) and cfg_lib.refusal(
        Annotated[tuple[bool, ...], cfg_lib.Items(0)], ()) is None
    assert cfg_lib.expected(tuple[int, int]) == "a tuple of 2 items, each an integer"
    assert cfg_lib.refusal(tuple[int, int], (1, 2, 3))
    assert cfg_lib.refusal(bool, 0) and cfg_lib.refusal(bool, False) is None
    assert cfg_lib.refusal(str, "") is None and cfg_lib.refusal(cfg_lib.NonEmpty, "  ")
    assert cfg_lib.refusal(cfg_lib.Path, "") is None and cfg_lib.refusal(cfg_lib.Path, "a/b.csv") is None
    assert cfg_lib.refusal(cfg_lib.Path, " a.csv") and cfg_lib.refusal(cfg_lib.Path, 3)
    boom = Annotated[int, cfg_lib.Rule(lambda v: 1 / v > 0, "a positive number")]
    assert cfg_lib.refusal(boom, 0) == "a positive number"  # an exception in the test refuses
    why = Annotated[str, cfg_lib.Rule(lambda v: int(v) > 0, "a count")]
    assert cfg_lib.refusal(why, "x").startswith("a count (invalid literal")  # a ValueError says why
    names = cfg_lib.datasets("ETTh1", "exchange_rate", several=True)
    assert cfg_lib.refusal(names, "etth1, Exchange_Rate") is None and cfg_lib.refusal(names, "") is None
    assert cfg_lib.refusal(names, "etth2") == "comma-separated names of ETTh1, exchange_rate or '' for none"
    assert cfg_lib.refusal(cfg_lib.datasets("a", "b"), "a,b")


@dataclasses.dataclass(frozen=True)
class _Group:
    b: cfg_lib.NonNegative = 2.0
    c: int = 0

    def __post_init__(self):
        if self.c > self.b:
            raise cfg_lib.FieldError("expected c <= b", c=self.c, b=self.b)


@dataclasses.dataclass(frozen=True)
class _Schema:
    a: cfg_lib.Count = 1
    g: _Group = _Group()

    def __post_init__(self):
        if self.a > 5:
            raise cfg_lib.FieldError("expected a <= 5", a=self.a)


def test_validate_field_coverage_and_check_order():
    config = ml_collections.ConfigDict(cfg_lib.defaults(_Schema))
    assert config.to_dict() == {"a": 1, "g": {"b": 2.0, "c": 0}}
    assert cfg_lib.validate(config, _Schema) == _Schema()
    extra = ml_collections.ConfigDict({**config.to_dict(), "h": 1})
    with pytest.raises(ValueError, match="'h' is not a field of this experiment"):
        cfg_lib.validate(extra, _Schema)
    with pytest.raises(ValueError, match=r"lacks the field.*'g.c'"):
        cfg_lib.validate(ml_collections.ConfigDict({"a": 1, "g": {"b": 2.0}}), _Schema)
    with pytest.raises(ValueError, match=r"config field 'g' = 3: expected a group of the fields b, c"):
        cfg_lib.validate(_with(config, "g", 3), _Schema)
    # a group's check names its fields by their paths; the checks run once every field passed
    with pytest.raises(ValueError, match=r"^config fields g.c=3 and g.b=2.0: expected c <= b$"):
        cfg_lib.validate(_with(config, "g.c", 3), _Schema)
    with pytest.raises(ValueError, match=r"^config field 'a' = 6: expected a <= 5$"):
        cfg_lib.validate(_with(config, "a", 6), _Schema)
    with pytest.raises(ValueError, match=r"^config field 'a' = 0: expected an integer >= 1$"):
        cfg_lib.validate(_with(_with(config, "a", 0), "g.c", 3), _Schema)


def test_variant_override_of_the_wrong_type_names_the_field():
    with pytest.raises(ValueError, match=r"config field 'steps' = 'abc': expected an integer$"):
        MODULES["lm"].get_config("smoke,steps=abc")
    assert cfg_lib.parse_arg("tiny,lm_config='smoke,steps=2',ns=(1, 2)") == (
        "tiny", {"lm_config": "smoke,steps=2", "ns": (1, 2)})


def test_another_experiments_config_file_names_both():
    spf = MODULES["spf"].get_config("tiny")
    with pytest.raises(ValueError, match=r"'experiments/configs/spf.py' is the config of experiment "
                                         r"'spf', not of 'lm'"):
        cfg_lib.validate_module_config(spf, MODULES["lm"], "experiments/configs/spf.py:tiny")
    # a config file of another name that is no experiment's is checked field by field
    with pytest.raises(ValueError, match="'problems' is not a field"):
        cfg_lib.validate_module_config(spf, MODULES["lm"], "/tmp/my_config.py")


def test_config_choices_match_the_library_constants():
    """The configs of forecasting, rl_scaling (advantage, aggregation) and spf name their choices
    without importing the libraries; they must match the code's."""
    from algorithms.forecasting.data import FILL_GAPS, SPLITS
    from algorithms.forecasting.metrics import OUT_OF_RANGE
    from algorithms.rl_scaling.grpo import ADVANTAGE_MODES, AGGREGATIONS
    from algorithms.spf.problems import DRIFTS, KINDS

    def choices(name, path, probe):
        return {c for c in probe if cfg_lib.refusal(_type(MODULES[name], path), c) is None}

    assert choices("rl_scaling", "advantage", ADVANTAGE_MODES + ("ppo",)) == set(ADVANTAGE_MODES)
    assert choices("rl_scaling", "aggregation", AGGREGATIONS + ("sum",)) == set(AGGREGATIONS)
    assert choices("forecasting", "split", SPLITS + ("x",)) == set(SPLITS)
    assert choices("forecasting", "fill_gaps", FILL_GAPS + ("x",)) == set(FILL_GAPS)
    assert choices("forecasting", "qice_out_of_range", OUT_OF_RANGE + ("x",)) == set(OUT_OF_RANGE)
    assert set(MODULES["spf"].PROBLEMS) == {f"{k}_{d}" for k in KINDS for d in DRIFTS}


# -- model fields: the library's own checks and choices ------------------------------------------

@pytest.mark.parametrize("name, path, value, named, reason", [
    # TransformerConfig.__post_init__'s refusals, reworded with the config's field paths
    ("lm", "model.num_kv_heads", 3, ("model.num_heads=2", "model.num_kv_heads=3"), "multiple"),
    ("lm", "model.d_model", 30, ("model.d_model=30", "model.num_heads=2"), "head_dim=15"),
    ("lm", "model.d_model", -1, ("model.d_model=-1",), "must be >= 1"),
    ("lm", "model.attention_block", 0, ("model.attention_block=0",), "must be >= 1"),
    ("lm", "model_parallelism", 4, ("model_parallelism=4",), "does not divide"),
    ("diffusion_lm", "sizes", ((8, 1, 1), (12, 1, 1), (30, 1, 2)), ("sizes[2]=(30, 1, 2)",),
     "head_dim=15"),
    ("diffusion_lm", "sizes", ((8, 1, 1), (12, 0, 1), (16, 1, 1)), ("sizes[1]=(12, 0, 1)",),
     "num_layers=0"),
    ("diffusion_lm", "backbone.attention_block", 0, ("backbone.attention_block=0",), ">= 1"),
    ("diffusion_lm", "evaluator.model.num_kv_heads", 3,
     ("evaluator.model.num_heads=2", "evaluator.model.num_kv_heads=3"), "multiple"),
    ("diffusion_lm", "evaluator.model.d_model", 6,
     ("evaluator.model.d_model=6", "evaluator.model.num_heads=2"), "head_dim=3"),
])
def test_a_bad_model_field_is_refused_once_naming_its_path(name, path, value, named, reason):
    config = _with(MODULES[name].get_config("smoke"), path, value)
    assert not cfg_lib.field_problems(MODULES[name].Config, config)  # the field alone passes
    message = _refused(name, config, path.split(".")[-1])
    assert message.startswith(f"config field{'s' if len(named) > 1 else ''} {named[0]}"), message
    assert all(n in message for n in named) and reason in message, message
    assert "TransformerConfig" in message and message.count("config field") == 1, message


@pytest.mark.parametrize("name, paths", [
    ("lm", ("model.",)), ("diffusion_lm", ("backbone.", "evaluator.model.")),
    ("rl_scaling", ("model.",)),
])
def test_every_choice_the_library_lists_is_accepted(name, paths):
    """The model's choices are read from the library: each one it lists validates (the config
    is built with it), and a name it does not list is refused naming the field."""
    from algorithms.diffusion_lm.families import FAMILIES
    from models.attention import IMPLEMENTATIONS
    from models.transformer import COMPUTE_DTYPES, REMAT_POLICIES

    listed = {"attention": IMPLEMENTATIONS, "remat": tuple(REMAT_POLICIES),
              "dtype": COMPUTE_DTYPES}
    config = MODULES[name].get_config("smoke")
    seen = 0
    for prefix in paths:
        for field, values in listed.items():
            if prefix + field not in _leaves(config):
                continue
            seen += 1
            for value in values:
                cfg_lib.validate_module_config(_with(config, prefix + field, value), MODULES[name])
            _refused(name, _with(config, prefix + field, "flash"), prefix + field)
    assert seen >= 2
    if name == "diffusion_lm":
        for family in FAMILIES:  # each family alone beside the three the claim needs
            families = tuple(dict.fromkeys(("ar", "mdlm", "duo", family)))
            cfg_lib.validate_module_config(_with(config, "families", families), MODULES[name])
        _refused(name, _with(config, "families", ("ar", "mdlm", "duo", "bert")), "families")


# -- the entry points: one line, exit status 2, before any work ------------------------------------

ENTRY_POINT_CASES = [
    (("experiments.lm", "--config=experiments/configs/lm.py:smoke,steps=abc"),
     "error: lm: --config=experiments/configs/lm.py:smoke,steps=abc: config field 'steps' = "
     "'abc': expected an integer"),
    (("experiments.main", "--experiments=judge_btl", "--variant=smoke,heldout_fraction=1.0"),
     "error: main: judge_btl: config field 'heldout_fraction' = 1.0: expected a finite number "
     "in (0, 1)"),
]


@pytest.fixture(scope="module")
def entry_point_runs(tmp_path_factory):
    """{args: (CompletedProcess, its empty workdir)} of every case, run as forks of one process."""
    workdirs = {args: tmp_path_factory.mktemp("workdir") for args, _ in ENTRY_POINT_CASES}
    runs = forked_cli.run_commands({args: [sys.executable, "-m", *args, f"--workdir={w}"]
                                    for args, w in workdirs.items()})
    return {args: (runs[args], workdirs[args]) for args in workdirs}


@pytest.mark.parametrize("args, expected", ENTRY_POINT_CASES)
def test_entry_points_refuse_bad_fields_in_one_line(entry_point_runs, args, expected):
    proc, workdir = entry_point_runs[args]
    assert proc.returncode == 2
    assert proc.stderr.strip() == expected
    assert not any(workdir.iterdir())  # nothing written


@pytest.mark.parametrize("name, warmup, bound, steps", [
    ("lm", "warmup_steps", "steps", 4),  # smoke: 4 steps
    ("diffusion_lm", "evaluator.warmup_steps", "evaluator.steps", 4),
    ("rl_scaling", "warmup.warmup_steps", "warmup.max_steps", 8),
])
def test_a_warmup_longer_than_training_is_refused_naming_both_fields(name, warmup, bound, steps):
    config = MODULES[name].get_config("smoke")
    assert cfg_lib.get_field(config, bound) == steps
    cfg_lib.validate_module_config(_with(config, warmup, steps), MODULES[name])  # equal: fits
    with pytest.raises(ValueError) as info:
        cfg_lib.validate_module_config(_with(config, warmup, steps + 1), MODULES[name])
    assert f"{warmup}={steps + 1} and {bound}={steps}" in str(info.value), str(info.value)


def test_a_warmup_longer_than_training_is_refused_in_a_nested_lm_variant():
    with pytest.raises(ValueError, match=r"warmup_steps=5 and steps=4"):
        cfg_lib.validate_module_config(
            MODULES["kv_quant"].get_config("smoke,lm_config='smoke,warmup_steps=5'"),
            MODULES["kv_quant"])
