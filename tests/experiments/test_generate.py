"""experiments.generate on a tiny random Llama checkpoint with a trained tokenizer.json."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import generate as gen
from models import hf_checkpoint as hfc
from models.sampling import generate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "to be or not to be that is the question"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    path = str(tmp_path_factory.mktemp("tiny_llama"))
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([PROMPT, "all the world is a stage and all the men players"],
                            trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    tok.save(os.path.join(path, "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                   intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=64, eos_token_id=1, bos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return path


def test_greedy_loop_equals_the_jitted_sampler(checkpoint):
    opts = gen.GenerateOptions(max_new_tokens=12, stop_at_eos=False, progress=False)
    out = gen.generate_text(checkpoint, PROMPT, opts)
    ck = hfc.load_checkpoint(checkpoint)
    ids = hfc.load_tokenizer(checkpoint).encode(PROMPT)
    want, _ = generate(ck.graphdef, ck.params, jnp.asarray([ids], jnp.int32), jax.random.key(0),
                       max_new_tokens=12, temperature=0.0)
    assert out["tokens"] == np.asarray(want)[0].tolist()
    assert out["prompt_tokens"] == len(ids) == 10 and out["tokens_per_s"] > 0
    # EntroKV keeping the whole prompt is the dense cache.
    full = gen.generate_text(checkpoint, PROMPT, gen.GenerateOptions(
        kv_cache="entrokv", entrokv_fraction=1.0, entrokv_window=4, max_new_tokens=12,
        stop_at_eos=False, progress=False))
    assert full["tokens"] == out["tokens"]


def test_cli_generates_and_reports_speed(checkpoint, tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(PROMPT)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "experiments.generate", f"--checkpoint={checkpoint}",
           f"--prompt_file={prompt_file}", "--kv_cache=dense", "--max_new_tokens=6",
           "--temperature=0.7", "--nostop_at_eos"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "6 tokens after a 10-token prompt" in proc.stderr and "tokens/s" in proc.stderr
    words = proc.stdout.split()
    assert words and all(w in PROMPT.split() + "all the world is a stage and men players".split()
                         for w in words)
    bad = subprocess.run(cmd[:3] + [f"--checkpoint={tmp_path / 'missing'}",
                                    f"--prompt_file={prompt_file}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("error: generate: ")
    assert "not a Hugging Face directory, a GGUF file or a packaged model" in last


def test_a_template_that_appends_eos_does_not_end_the_prompt(checkpoint, tmp_path, caplog):
    """A ``<s> $A </s>`` post-processor would feed [1, 4, 3, 7, 6, 4, 3, 2]: the prompt is
    generated from without the template's EOS, so its first token is the model's argmax after
    [1, 4, 3, 7, 6, 4, 3], and a warning says so."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    path = str(tmp_path / "eos_template")
    shutil.copytree(checkpoint, path)
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "be": 3, "to": 4, "that": 5, "not": 6, "or": 7}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.save(os.path.join(path, "tokenizer.json"))
    assert tok.encode("to be or not to be").ids == [1, 4, 3, 7, 6, 4, 3, 2]
    opts = gen.GenerateOptions(max_new_tokens=1, stop_at_eos=False, progress=False)
    with caplog.at_level("WARNING", logger="experiments.generate"):
        out = gen.generate_text(path, "to be or not to be", opts)
    assert out["prompt_ids"] == [1, 4, 3, 7, 6, 4, 3] and out["eos_dropped"] == 1
    assert "appends </s> [2] to every text" in caplog.records[-1].getMessage()
    ck = hfc.load_checkpoint(path)
    from flax import nnx
    logits = nnx.merge(ck.graphdef, ck.params)(jnp.asarray([out["prompt_ids"]], jnp.int32))
    assert out["tokens"] == [int(jnp.argmax(logits[0, -1]))]


@pytest.fixture(scope="module")
def metaspace_checkpoint(tiny_llama_checkpoint, tmp_path_factory):
    """The tiny Llama of ``tiny_llama_checkpoint`` with a SentencePiece-style tokenizer.json
    (Metaspace "▁" words, as Llama-2 and Mistral; <s> first) trained here on the start of Hamlet
    to the model's vocabulary size, so that every generated id is a piece of text."""
    import json
    import shutil

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from core.data.text import shakespeare_files

    path = str(tmp_path_factory.mktemp("tiny_llama_metaspace"))
    shutil.copytree(tiny_llama_checkpoint, path, dirs_exist_ok=True)
    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    hamlet = next(p for p in shakespeare_files() if os.path.basename(p) == "hamlet_gut.txt")
    with open(hamlet, encoding="utf-8") as f:
        text = f.read(60_000)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab,
                                                        special_tokens=["<s>", "</s>"]))
    assert tok.get_vocab_size() == vocab
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(os.path.join(path, "tokenizer.json"))
    return path


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_prompt_with_its_own_bos_and_the_continuation_text(kind, tiny_llama_checkpoint,
                                                          metaspace_checkpoint, caplog):
    """A prompt that begins with the BOS text (a chat template's output) gets one BOS id and a
    warning; the continuation is the text transformers' generation pipeline returns:
    decode(prompt ids + new ids) minus decode(prompt ids)."""
    path = {"bytelevel": tiny_llama_checkpoint, "metaspace": metaspace_checkpoint}[kind]
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
    bos = ref.convert_tokens_to_ids("<s>")
    opts = gen.GenerateOptions(max_new_tokens=6, stop_at_eos=False, progress=False)
    with caplog.at_level("WARNING", logger="experiments.generate"):
        plain = gen.generate_text(path, PROMPT, opts)
    assert plain["bos_dropped"] == 0 and not caplog.records
    assert plain["prompt_ids"] == ref(PROMPT)["input_ids"]
    with caplog.at_level("WARNING", logger="experiments.generate"):
        out = gen.generate_text(path, "<s>" + PROMPT, opts)
    ids = out["prompt_ids"]
    assert ids[0] == bos and ids.count(bos) == 1 and out["bos_dropped"] == 1
    assert ids == ref("<s>" + PROMPT, add_special_tokens=False)["input_ids"]
    assert out["prompt_tokens"] == len(ids)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "already begins with the tokenizer's BOS <s>" in caplog.records[0].getMessage()
    for res in (plain, out):
        full = ref.decode(res["prompt_ids"] + res["tokens"], skip_special_tokens=True)
        assert PROMPT + res["text"] == full
        assert res["text"] == full[len(ref.decode(res["prompt_ids"], skip_special_tokens=True)):]
    if kind == "bytelevel":  # the same ids as the plain prompt, so the same greedy tokens
        assert ids == plain["prompt_ids"] and out["tokens"] == plain["tokens"]
    else:  # the greedy continuation starts a word: "▁" is its leading space, which it keeps
        first = ref.convert_ids_to_tokens(plain["tokens"][0])
        assert first.startswith("▁") and plain["text"].startswith(" " + first[1:])


def test_progress_bar_rate_counts_the_steps_that_tokens_per_s_counts(checkpoint, monkeypatch):
    """The bar's rate, like tokens_per_s, leaves out the first decode step (its compilation):
    it was counted from the start, so the bar read about 11 tok/s where the summary read 1272.
    The bar's clock restarts after that step with one token as its initial count, and it shows
    the average rate (no moving average), so its rate is (n - initial) / elapsed over the same
    steps as tokens_per_s."""
    import tqdm

    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.n, self.initial, self.resets, self.closed = kwargs, 0, 0, [], False
            bars.append(self)

        def update(self, k):
            self.n += k

        def reset(self):
            self.resets.append(self.n)
            self.n = 0

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    out = gen.generate_text(checkpoint, PROMPT, gen.GenerateOptions(
        max_new_tokens=5, stop_at_eos=False, progress=True))
    (bar,) = bars
    assert bar.kwargs["smoothing"] == 0 and bar.closed
    assert bar.resets == [0]  # reset once, after the first step and before it is counted
    assert bar.n == len(out["tokens"]) == 5 and bar.initial == 1
    # the bar's rate is (n - initial) / elapsed since the reset: the steps tokens_per_s counts
    assert bar.n - bar.initial == 4
    assert 0 < out["first_step_s"] < out["decode_s"]
    assert out["tokens_per_s"] == pytest.approx(4 / (out["decode_s"] - out["first_step_s"]))
