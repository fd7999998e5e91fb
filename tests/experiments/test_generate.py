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
    assert last.startswith("error: generate: ") and "not a checkpoint directory" in last
