import json
import subprocess
import sys

import pytest

from experiments import lm, registry
from experiments.configs import lm as lm_config


def test_unknown_experiment_lists_known_ones():
    with pytest.raises(ValueError, match="unknown experiment 'nope'; known experiments: "):
        registry.resolve("lm,nope")


def test_registry_is_every_config_module_with_requirements_first():
    import pkgutil

    from experiments import configs

    order = registry.EXPERIMENTS
    assert set(order) == {m.name for m in pkgutil.iter_modules(configs.__path__)
                          if not m.name.startswith("_")}
    for name in order:
        _, config_module = registry.load(name)
        for req in getattr(config_module, "REQUIRES", ()):
            assert order.index(req) < order.index(name), (req, name)
    assert order.index("lm") < order.index("sparse_decode")
    # the main job: every experiment but the byte lm, which runs when named (and first)
    assert registry.resolve("all") == tuple(n for n in order if n != "lm")
    assert registry.resolve("") == registry.resolve(None) == registry.resolve("all")
    assert registry.resolve("sparse_decode,lm") == ("sparse_decode", "lm")


def test_main_exit_code_on_unknown_experiment(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.main", "--experiments=bogus",
                           f"--workdir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown experiment 'bogus'" in proc.stderr and "lm" in proc.stderr


def test_lm_run_end_to_end(tmp_path):
    config = lm_config.get_config(
        "tiny,steps=6,log_every=2,checkpoint_every=3,eval_windows=4,sample_len=8,batch_size=4,"
        "seq_len=32,model.d_model=32,model.num_layers=1,model.num_heads=2,model.num_kv_heads=1,"
        "model.max_len=64")
    section = lm.run(config, str(tmp_path))
    metrics = json.loads((tmp_path / "lm" / "metrics.json").read_text())
    for key in ("val_bpb", "unigram_bpb", "bigram_bpb", "train_tokens_per_s", "params", "steps"):
        assert key in metrics
    assert metrics["steps"] == 6 and metrics["params"] > 0
    # an untrained-ish model is near uniform over 258 tokens (8.01 bits), never below the entropy 0
    assert 0.0 < metrics["val_bpb"] < 9.0
    assert metrics["bigram_bpb"] < metrics["unigram_bpb"] < 8.0
    assert (tmp_path / "lm" / "loss.png").stat().st_size > 1000
    assert section.headline["method"].startswith("Transformer LM")
    assert metrics["train_tokens_per_s"] > 0
    # a rerun restores the finished run: no training here, so no throughput (not 0 or negative)
    again = lm.run(config, str(tmp_path))
    metrics = json.loads((tmp_path / "lm" / "metrics.json").read_text())
    assert metrics["train_tokens_per_s"] is None and metrics["resumed_from"] == 6
    assert "Restored from the finished run's checkpoint at step 6" in again.body


def test_lm_missing_data_path_names_the_path(tmp_path):
    config = lm_config.get_config(f"tiny,data_path={tmp_path}/missing.txt")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        lm.run(config, str(tmp_path))


def test_lm_text_shorter_than_one_window_names_the_file_split_and_fix(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("a short note\n" * 3)  # 39 bytes: the held-out tenth is far below 33 tokens
    config = lm_config.get_config(f"smoke,data_path={path}")
    with pytest.raises(ValueError, match=r"lm: the held-out split of data_path='.*short.txt' "
                                         r"\(short: last \d+%\) has \d+ tokens, fewer than one window "
                                         r"of seq_len \+ 1 = \d+; .* lower --config.seq_len"):
        lm.run(config, str(tmp_path / "wd"))


def test_lm_sequence_longer_than_model_raises(tmp_path):
    config = lm_config.get_config("tiny,seq_len=512")
    with pytest.raises(ValueError, match="seq_len=512 and model.max_len=256: expected seq_len <= "
                                         "model.max_len"):
        lm.run(config, str(tmp_path))


@pytest.mark.slow
def test_main_runs_experiments_in_isolated_processes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.main", "--experiments=lm,benchmark_game",
                           "--variant=smoke", f"--workdir={tmp_path}"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report_md = (tmp_path / "report.md").read_text()
    assert "| Transformer LM (foundation) |" in report_md
    assert "## Byte-level language model (lm)" in report_md and "benchmark_game" in report_md.lower()
    for name in ("lm", "benchmark_game"):
        assert (tmp_path / name / "metrics.json").exists()
        assert json.loads((tmp_path / name / "section.json").read_text())["title"]


def test_lm_on_one_text_file_reports_its_own_held_out_split_and_prompt(tmp_path):
    path = tmp_path / "diary.txt"
    path.write_text("".join(f"Day {i}: the weather was {'fair' if i % 3 else 'wet'}.\n"
                            for i in range(60)))
    config = lm_config.get_config(f"smoke,data_path={path}")
    section = lm.run(config, str(tmp_path / "wd"))
    metrics = json.loads((tmp_path / "wd" / "lm" / "metrics.json").read_text())
    cut = metrics["train_bytes"]
    text = path.read_bytes()
    assert cut + metrics["val_bytes"] == len(text) and text[cut - 1:cut] == b"\n"
    held_out = text[cut:].decode()
    assert metrics["val_docs"] == [f"diary: last {metrics['val_bytes'] / len(text):.0%}"]
    assert f"Held-out text: {metrics['val_docs'][0]}." in section.body
    # the sample starts from the held-out text's first line, not from the plays
    prompt = held_out.split("\n")[0] + "\n"
    assert f"```\n{prompt}" in section.body
    assert "ROMEO" not in section.body and "plays" not in section.body
