"""The benchmark_game report follows its config: labels, the Delta = 0 condition and the claim."""

import json
import os

from experiments import benchmark_game
from experiments.configs import benchmark_game as bg_config


def test_overridden_config_is_reflected_in_the_report(tmp_path):
    config = bg_config.get_config("smoke")
    config.theta = (1.0, 0.75, 0.5, 0.25)  # four providers instead of three
    config.theta5 = (1.0, 0.7, 0.4)
    config.levels = 9
    config.cost_scale = 5.0  # effort too dear: zero effort is an equilibrium already at Delta = 0
    section = benchmark_game.run(config, str(tmp_path))
    labels = benchmark_game.game_labels(config)
    assert labels["main"] == "N=4, 9 levels, additive, winner_take_all"
    assert labels["five"] == "N=3, 5 levels, additive, linear"
    for label in labels.values():
        assert f"| {label} |" in section.body
    assert "N=5" not in section.body and "101 levels" not in section.body
    assert section.headline["ours"].startswith("N=4, 9 levels, additive, winner_take_all: 1 pure NE")
    with open(os.path.join(tmp_path, "benchmark_game", "metrics.json")) as f:
        m = json.load(f)
    assert m["game_labels"] == labels
    # Effort too dear for the condition (margin < 0): zero effort, ranked by quality, is the unique
    # equilibrium at Delta = 0, so the paper's first statement does not hold here.
    assert m["zero_effort_margin"] < 0 and m["n_pure_ne_at_zero"] == 1 and m["delta_star_closed_form"] == 0
    assert m["claim"]["checks"]["n_pure_ne_at_zero == 0"] is False
    assert m["claim"]["verdict"] != "yes"
    assert set(m["seconds"]) == {"n4_m9", "n3_m5"}
