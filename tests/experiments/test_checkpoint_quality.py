"""sparse_decode and kv_quant measured on a Hugging Face checkpoint (``checkpoint=DIR``) instead of
the byte-level lm: a tiny random Llama and its own tokenizer (fixture in conftest.py)."""

import json
import math
import os

import numpy as np
import pytest

from core import config as cfg_lib
from experiments import kv_quant, measured_model, sparse_decode
from experiments.configs import kv_quant as kv_quant_config
from experiments.configs import sparse_decode as sparse_decode_config
from models import hf_checkpoint as hfc

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _config(module, checkpoint, **fields):
    config = module.get_config("smoke")
    config.checkpoint = checkpoint
    for k, v in fields.items():
        config[k] = v
    cfg_lib.validate_module_config(config, module)
    return config


def _finite(tree):
    """Every number in a metrics tree is finite."""
    if isinstance(tree, dict):
        return all(_finite(v) for v in tree.values())
    if isinstance(tree, list):
        return all(_finite(v) for v in tree)
    if isinstance(tree, bool) or not isinstance(tree, int | float):
        return True
    return math.isfinite(tree)


def _check_model(info, checkpoint):
    assert info["kind"] == "checkpoint" and info["architecture"] == "llama"
    assert info["checkpoint"] == os.path.abspath(checkpoint)
    assert (info["layers"], info["heads"], info["kv_heads"], info["head_dim"],
            info["max_len"]) == (1, 2, 1, 16, 128)
    # a random tiny Llama: its loss on the text is about that of a uniform guess, and the note
    # says the weights are untrained
    assert info["note_tokens"] > 1
    assert info["note_nll"] >= measured_model.CHANCE_FRACTION * math.log(info["vocab_size"])
    assert info["note"] == measured_model.weights_note(info["note_nll"], info["note_tokens"],
                                                       info["vocab_size"])
    assert "predict the text no better than chance" in info["note"]
    assert "nothing is downloaded" in info["note"]


def test_the_weights_note_tells_trained_from_untrained_weights():
    vocab = 32_000  # log V = 10.37
    trained = measured_model.weights_note(2.5, 128, vocab)
    assert "2.50 nats per token on the first 128 tokens" in trained and "log V = 10.37" in trained
    assert "untrained" not in trained and "plumbing" not in trained
    for nll in (0.9 * math.log(vocab), 12.0):  # at the threshold, and worse than uniform
        untrained = measured_model.weights_note(nll, 128, vocab)
        assert "no better than chance" in untrained and "only prove the plumbing" in untrained


def test_tokenizer_prefix_and_windows(tiny_llama_checkpoint, tmp_path):
    tok = hfc.load_tokenizer(tiny_llama_checkpoint)
    bos = tok.backend.token_to_id("<s>")
    assert tok.prefix_ids() == (bos,)
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be, that is the question. " * 20)
    config = _config(kv_quant_config, tiny_llama_checkpoint, data_path=str(text))
    model = measured_model.load(config, str(tmp_path))
    ids = tok.encode(text.read_text(), add_special_tokens=False)
    np.testing.assert_array_equal(model.text, ids)
    w = model.windows(10, 3)
    # each window: BOS then the next 9 text tokens, from the start of the text, evenly spread
    assert w.shape == (3, 10) and (w[:, 0] == bos).all()
    n = len(ids) // 9
    starts = np.linspace(0, n - 1, 3).astype(int) * 9
    for row, s in zip(w, starts, strict=True):
        np.testing.assert_array_equal(row[1:], ids[s:s + 9])
    with pytest.raises(ValueError, match="fewer than one window"):
        model.windows(len(ids) + 2, 1)


def test_a_checkpoint_is_measured_on_prose_written_after_its_release(tiny_llama_checkpoint,
                                                                     tmp_path):
    """With ``data_path=''`` a checkpoint reads the bundled unseen prose, all of it, and it holds
    more tokens than the tiny configs' measurements take (kv_quant's windows, sparse_decode's
    capture) under the packaged model's tokenizer."""
    from core.data.files import read_text
    from core.data.text import UNSEEN_PROSE
    from models import checkpoints

    text = read_text(UNSEEN_PROSE)
    config = _config(kv_quant_config, tiny_llama_checkpoint, data_path="")
    model = measured_model.load(config, str(tmp_path))
    tok = hfc.load_tokenizer(tiny_llama_checkpoint)
    np.testing.assert_array_equal(model.text, tok.encode(text, add_special_tokens=False))
    assert model.info["text"] == measured_model.DEFAULT_TEXT
    smollm2 = checkpoints.load_tokenizer("smollm2-135m")
    tokens = len(smollm2.encode(text, add_special_tokens=False))
    kv, sd = kv_quant_config.get_config("tiny"), sparse_decode_config.get_config("tiny")
    assert tokens >= 2 * max(kv.windows * kv.context, sd.real_context)


@pytest.mark.slow
def test_sparse_decode_measures_the_checkpoint(tiny_llama_checkpoint, tmp_path):
    config = _config(sparse_decode_config, tiny_llama_checkpoint)
    section = sparse_decode.run(config, str(tmp_path))
    metrics = json.loads((tmp_path / "sparse_decode" / "metrics.json").read_text())
    _check_model(metrics["model"], tiny_llama_checkpoint)
    assert metrics["model"]["text"] == measured_model.DEFAULT_TEXT
    assert not (tmp_path / "lm").exists()  # the byte-level lm was neither trained nor read
    assert _finite(metrics)
    real = metrics["real"]
    # smoke asks for 1024 tokens; the checkpoint's max_len of 128 caps it (4 pages of 32)
    assert real["context"] == 128 and real["page_size"] == 32 and real["layers"] == 1
    for key in ("density", "quest_density"):
        assert 0.0 < real[key] <= 1.0
    for key in ("kept_mass", "quest_kept_mass"):
        assert 0.0 < real[key] <= 1.0 + 1e-6
    assert real["rel_err"] >= 0.0 and real["quest_rel_err"] >= 0.0
    assert 0.0 <= metrics["greedy"]["greedy_token_match"] <= 1.0
    assert metrics["greedy"]["greedy_tokens"] == 2 * config.greedy_new
    assert os.path.abspath(tiny_llama_checkpoint) in section.body
    assert "only prove the plumbing" in section.body


@pytest.mark.slow
def test_kv_quant_measures_the_checkpoint(tiny_llama_checkpoint, tmp_path):
    text = tmp_path / "held_out.txt"
    text.write_text("Now is the winter of our discontent made glorious summer by this sun of "
                    "York; and all the clouds that lour'd upon our house in the deep bosom of "
                    "the ocean buried. " * 8)
    config = _config(kv_quant_config, tiny_llama_checkpoint, data_path=str(text))
    section = kv_quant.run(config, str(tmp_path / "work"))
    metrics = json.loads((tmp_path / "work" / "kv_quant" / "metrics.json").read_text())
    _check_model(metrics["model"], tiny_llama_checkpoint)
    assert metrics["model"]["text"] == str(text)
    assert metrics["nll_unit"] == "bits per token"
    assert not (tmp_path / "work" / "lm").exists()
    assert _finite(metrics)
    assert metrics["config"]["head_dim"] == 16 and metrics["config"]["context"] == 64
    assert metrics["config"]["windows"] == config.windows
    for m in ("full", "qvg", "qvg_post_rope", "qvg_pro", "kivi", "entrokv_30pct",
              "uniform_30pct"):
        assert metrics[f"bpb_{m}"] > 0.0
    for m in ("qvg", "qvg_post_rope", "qvg_pro", "kivi"):
        assert metrics[f"{m}_rel_err"] >= 0.0 and metrics[f"{m}_compression"] > 1.0
    # keys stored after RoPE: the same bits, but other keys quantized (a different error)
    assert metrics["qvg_post_rope_effective_bits"] == metrics["qvg_effective_bits"]
    assert metrics["qvg_post_rope_rel_err"] != metrics["qvg_rel_err"]
    assert "| qvg_post_rope |" in section.body
    # every cache of the table, QVG-Pro included, has its held-out number (no nan cell)
    assert "nan" not in section.body.lower()
    assert os.path.abspath(tiny_llama_checkpoint) in section.body
    assert "bits per token" in section.body and "only prove the plumbing" in section.body


def test_checkpoint_limits_are_refused_naming_the_fields(tiny_llama_checkpoint, tmp_path):
    # prompt_len must leave tokens to decode within the checkpoint's max_len of 128
    config = _config(kv_quant_config, tiny_llama_checkpoint, context=256, prompt_len=128,
                     windows=1)
    with pytest.raises(ValueError, match="prompt_len = 128.*max_len=128 of the checkpoint"):
        kv_quant.run(config, str(tmp_path))
    config = _config(sparse_decode_config, tiny_llama_checkpoint, real_page_size=128)
    with pytest.raises(ValueError, match="real_context=1024 and real_page_size=128"):
        sparse_decode.real_quality(config, measured_model.load(config, str(tmp_path)))
    missing = _config(kv_quant_config, tiny_llama_checkpoint, data_path=str(tmp_path / "none.txt"))
    with pytest.raises(ValueError, match="config field data_path = .*none.txt.*no such file"):
        measured_model.load(missing, str(tmp_path))


def test_a_text_that_begins_with_bos_gives_one_bos_per_window(tiny_llama_checkpoint, tmp_path,
                                                               caplog):
    """A text file whose first characters are the BOS text: its encoded BOS is dropped, so the
    first window starts with exactly one BOS, followed by the text after it."""
    tok = hfc.load_tokenizer(tiny_llama_checkpoint)
    bos = tok.backend.token_to_id("<s>")
    body = "to be or not to be, that is the question. " * 20
    text = tmp_path / "t.txt"
    text.write_text("<s>" + body)
    config = _config(kv_quant_config, tiny_llama_checkpoint, data_path=str(text))
    with caplog.at_level("WARNING"):
        model = measured_model.load(config, str(tmp_path))
    with_bos = tok.encode("<s>" + body, add_special_tokens=False)
    assert with_bos[0] == bos  # the text does encode to a leading BOS ...
    np.testing.assert_array_equal(model.text, with_bos[1:])  # ... which the windows do not repeat
    first = model.windows(10, 1)[0]
    assert first[0] == bos and first[1] != bos
    assert "begins with the tokenizer's prefix" in caplog.text


def test_the_scanned_layout_is_the_same_model(tiny_llama_checkpoint, tmp_path):
    """MeasuredModel.scanned: the blocks stacked, the same logits (a Llama checkpoint and a
    2-layer byte-level transformer)."""
    import jax.numpy as jnp
    from flax import nnx

    from models.transformer import Transformer, TransformerConfig

    lm_cfg = TransformerConfig(vocab_size=256, max_len=32, d_model=32, num_layers=2, num_heads=2)
    graphdef, params = nnx.split(Transformer(lm_cfg, rngs=nnx.Rngs(0)))
    byte_lm = measured_model.MeasuredModel(graphdef, params, lm_cfg, np.zeros(8, np.int32), (),
                                           {"kind": "byte_lm"})
    config = _config(kv_quant_config, tiny_llama_checkpoint)
    for model in (measured_model.load(config, str(tmp_path)), byte_lm):
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, 200, (2, 12)), jnp.int32)
        sg, sp = model.scanned
        assert nnx.merge(sg, sp).cfg.scan_layers
        np.testing.assert_allclose(np.asarray(nnx.merge(sg, sp)(tokens)),
                                   np.asarray(nnx.merge(model.graphdef, model.params)(tokens)),
                                   rtol=1e-5, atol=1e-5)
