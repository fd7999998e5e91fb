"""Llama-family checkpoints from one GGUF file (llama.cpp's format): config, weights, tokenizer.

A GGUF file carries its config and tokenizer as metadata (llama.cpp's key names) and its tensors
under llama.cpp's names, many of them block-quantized. It is read with the ``gguf`` library
(llama.cpp's own reader and dequantizer, ``gguf.GGUFReader`` and ``gguf.quants.dequantize``):

* :func:`config_from_gguf` maps the metadata of architectures ``llama`` and ``qwen2`` to
  :class:`models.llama.LlamaConfig` through the Hugging Face schema
  (:func:`models.hf_checkpoint.config_from_hf`): layers, widths, heads and kv heads, head dim
  (``attention.key_length``), context length, RMSNorm epsilon, RoPE theta (``rope.freq_base``)
  and scaling (``rope.scaling.type`` linear or yarn), tied embeddings (no ``output.weight``
  tensor), q/k/v biases (Qwen2). llama.cpp's converter writes Mistral models as architecture
  ``llama`` (``gguf`` has no architecture ``mistral``), and they load as such. No sliding window
  is applied: llama.cpp runs both architectures without one (an ``attention.sliding_window`` key
  is ignored, as llama.cpp and ``transformers``' GGUF loader ignore it), so a Mistral-7B-v0.1 file
  attends to all of a context longer than its 4096-token window, as llama.cpp does.
* :func:`load_checkpoint` dequantizes each tensor to float32 on the host (one at a time), undoes
  the row permutation that llama.cpp's converter applies to the query and key projections of
  architecture ``llama`` (it stores each head's rotary pairs interleaved, (x0, x_{D/2}), (x1,
  x_{D/2+1}), ...; the Hugging Face layout, and this project's RoPE, keeps the two halves apart),
  and places it through the same tensor-by-tensor builder as safetensors checkpoints
  (:func:`models.hf_checkpoint.build_params`: checks first, sharding by ``mesh``). Storage types:
  :data:`SUPPORTED_TYPES` (F32, F16, BF16; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; the K-quants Q2_K to
  Q6_K).
* :func:`load_tokenizer` builds a byte-level BPE tokenizer (``tokenizer.ggml.model == "gpt2"``)
  from the vocabulary, merges, token types (control tokens become special tokens), the
  pre-tokenizer named by ``tokenizer.ggml.pre`` (:data:`PRE_TOKENIZERS`), the BOS / EOS flags and
  ids, and the chat template (``tokenizer.chat_template``), as a
  :class:`models.hf_checkpoint.Tokenizer`. SentencePiece (``"llama"``) and other tokenizer types
  are refused.

Every bad input (a file that is not GGUF or is truncated, an architecture, tensor type, RoPE
scaling or tokenizer that is not supported, a missing metadata key) raises a one-line ValueError
that names the file; nothing partially loaded is returned.

Measured against ``transformers``' GGUF loader on the packaged SmolLM2-135M-Instruct Q4_1 file
(``smollm2-135m``, :mod:`models.checkpoints`), float32: logits on 256 tokens of held-out text
within 3.2e-6 of the largest |logit| (1.2e-4 against 36), the same NLL (2.934390 nats per token),
the same tokenizer ids on varied text, the same chat-template ids, and the same greedy tokens on
three chat prompts through ``experiments.generate --chat`` with the dense cache.

Dimensions: V vocabulary, E model width, H query heads, K kv heads, D head dim, F MLP width.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from typing import Any

import jax
import numpy as np

from core import sharding as shd
from models import hf_checkpoint as hfc
from models.llama import LlamaConfig

ARCHITECTURES = ("llama", "qwen2")
# Storage types read here (gguf.quants.dequantize implements each; the tests write every one).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# Hugging Face tensor name (the rest after ``model.layers.{i}.``) -> llama.cpp's (after ``blk.{i}.``).
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}

# The byte-level pre-tokenizers of ``tokenizer.ggml.pre``: the regular expressions llama.cpp splits
# text with (applied in turn) before the bytes are mapped to BPE symbols. None = GPT-2's split.
_GPT2_SPLIT = None
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS: dict[str, tuple[str | None, ...]] = {
    "gpt-2": (_GPT2_SPLIT,),
    # every digit on its own, then GPT-2's split (StarCoder's tokenizer, reused by SmolLM)
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "starcoder": (r"\p{N}", _GPT2_SPLIT),
    "refact": (r"\p{N}", _GPT2_SPLIT),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
    "deepseek-r1-qwen": (_QWEN2_SPLIT,),
}
# Pre-tokenizers whose tokenizer looks a whole word up in the vocabulary before merging
# (Llama 3's tokenizer.json sets ignore_merges; llama.cpp does the same for them).
_IGNORE_MERGES = ("llama-bpe", "llama3", "smaug-bpe")
# llama.cpp's token types (tokenizer.ggml.token_type).
_CONTROL, _USER_DEFINED = 3, 4


# ----------------------------------------------------------------------------------------------
# The file


@functools.lru_cache(maxsize=4)
def _reader(path: str, mtime_ns: int, size: int):
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError, KeyError, IndexError...
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "magic" in msg.lower():
            raise ValueError(f"{path}: not a GGUF file (it does not start with the GGUF magic "
                             "bytes)") from None
        raise ValueError(f"{path}: truncated or corrupt GGUF file ({msg})") from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ValueError(f"{path}: truncated GGUF file ({size:,} bytes; its tensors end at byte "
                         f"{end:,})")
    return reader


def open_gguf(path: str):
    """The ``gguf.GGUFReader`` of ``path`` (cached while the file is unchanged).

    Raises:
      ValueError: no such file, not a GGUF file, or a truncated or corrupt one.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    st = os.stat(path)
    return _reader(os.path.abspath(path), st.st_mtime_ns, st.st_size)


def metadata(reader) -> dict[str, Any]:
    """The file's key-value metadata as Python values (str, int, float, bool, or lists of them);
    the large tokenizer arrays (tokens, merges, token types, scores) are left out."""
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
            "tokenizer.ggml.scores")
    return {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith("GGUF.") and k not in skip}


def _array(reader, key: str) -> list | None:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


# ----------------------------------------------------------------------------------------------
# Config


def _architecture(reader, path: str) -> str:
    """``general.architecture``: the model type and the prefix of its metadata keys."""
    meta = reader.fields
    if "general.architecture" not in meta:
        raise ValueError(f"{path}: no general.architecture in the GGUF metadata")
    arch = meta["general.architecture"].contents()
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)}")
    return arch


def _rope_scaling(meta: dict, arch: str, path: str) -> dict | None:
    """The Hugging Face ``rope_scaling`` entry of the metadata's ``rope.scaling.*`` keys."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    linear = meta.get(f"{arch}.rope.scale_linear")  # the older key of a linear factor
    if kind is None and linear is not None and float(linear) != 1.0:
        return {"rope_type": "linear", "factor": float(linear)}
    if kind in (None, "none"):
        return None
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{path}: RoPE scaling {kind!r} ({arch}.rope.scaling.type) is not "
                         "supported; supported: none, linear, yarn")
    if factor is None:
        raise ValueError(f"{path}: RoPE scaling {kind!r} without {arch}.rope.scaling.factor")
    out = {"rope_type": kind, "factor": float(factor)}
    if kind == "yarn":
        extra = sorted(k for k in meta if k.startswith(f"{arch}.rope.scaling.yarn_")
                       and k.split(".")[-1] not in ("yarn_beta_fast", "yarn_beta_slow"))
        if extra or f"{arch}.rope.scaling.attn_factor" in meta:
            raise ValueError(f"{path}: YaRN settings {extra or [f'{arch}.rope.scaling.attn_factor']}"
                             " are not supported")
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        if orig is not None:
            out["original_max_position_embeddings"] = int(orig)
        for key in ("beta_fast", "beta_slow"):
            if f"{arch}.rope.scaling.yarn_{key}" in meta:
                out[key] = float(meta[f"{arch}.rope.scaling.yarn_{key}"])
    return out


def config_from_gguf(reader, *, path: str = "model.gguf", dtype: Any = "float32",
                     max_len: int | None = None) -> LlamaConfig:
    """:class:`LlamaConfig` of a GGUF file's metadata (and tensor names).

    The metadata is mapped to the Hugging Face ``config.json`` schema and read by
    :func:`models.hf_checkpoint.config_from_hf`. Keys llama.cpp requires are required here
    (``context_length``, ``embedding_length``, ``block_count``, ``feed_forward_length``,
    ``attention.head_count``, ``attention.layer_norm_rms_epsilon``); the others take llama.cpp's
    defaults (kv heads = heads, head dim = E / H, RoPE theta 10000, no scaling). V is the row
    count of ``token_embd.weight``.

    Args:
      reader: ``gguf.GGUFReader`` (:func:`open_gguf`).
      path: the file, named in error messages.
      dtype: parameter and computation dtype.
      max_len: override of the context length.

    Raises:
      ValueError (naming ``path``): an architecture other than :data:`ARCHITECTURES`, a missing
        required key, a RoPE dimension count other than the head dim (partial rotary), per-dimension
        RoPE frequency factors (``rope_freqs.weight``, Llama 3.1), an unsupported RoPE scaling, a
        key and value head dim that differ, a vocabulary size that disagrees with the embedding.
    """
    arch = model_type = _architecture(reader, path)
    meta = metadata(reader)
    tensors = {t.name: t for t in reader.tensors}

    def need(key: str):
        full = f"{arch}.{key}"
        if full not in meta:
            raise ValueError(f"{path}: metadata key {full} is missing")
        return meta[full]

    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // max(heads, 1)))
    value_dim = int(meta.get(f"{arch}.attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ValueError(f"{path}: attention.key_length {head_dim} != attention.value_length "
                         f"{value_dim} is not supported")
    rot = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise ValueError(f"{path}: {arch}.rope.dimension_count = {rot} rotates part of the head "
                         f"dim {head_dim}; partial rotary embeddings are not supported")
    if "rope_freqs.weight" in tensors:
        raise ValueError(f"{path}: tensor rope_freqs.weight (per-dimension RoPE frequency "
                         "factors, as Llama 3.1 files store their RoPE scaling) is not supported")
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: tensor token_embd.weight is missing from the checkpoint")
    vocab = int(tensors["token_embd.weight"].shape[-1])
    stated = meta.get(f"{arch}.vocab_size")
    if stated is not None and int(stated) != vocab:
        raise ValueError(f"{path}: {arch}.vocab_size = {stated} but token_embd.weight has {vocab} "
                         "rows")
    hf: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": vocab,
        "max_position_embeddings": int(need("context_length")),
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
        "rope_scaling": _rope_scaling(meta, arch, path),
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "silu",
    }
    if model_type == "llama":
        hf["attention_bias"] = "blk.0.attn_q.bias" in tensors
    else:
        hf["use_sliding_window"] = False
    return hfc.config_from_hf(hf, where=path, dtype=dtype, max_len=max_len)


# ----------------------------------------------------------------------------------------------
# Weights


def unpermute_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's converter's permutation of a query or key projection.

    The converter stores, within each head, output row ``2 j + t`` of the file as Hugging Face
    row ``t D/2 + j`` (j < D/2, t in {0, 1}): the interleaved rotary pairs of GPT-J-style RoPE.
    This is its inverse.

    Args:
      w: [heads * D, ...] the file's rows (a weight [H D, E] or a bias [H D]).
      heads: H for the query projection, K for the key projection.

    Returns:
      ``w`` in the Hugging Face row order, same shape and dtype.
    """
    rows = w.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"{rows} rows are not {heads} heads of an even dimension")
    return (w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


class _Dequantized:
    """One tensor of the file, dequantized (and unpermuted) in full on first indexing: GGUF
    blocks run along rows, so any slice needs whole rows dequantized."""

    def __init__(self, tensor, heads: int | None):
        self.tensor, self.heads, self.array = tensor, heads, None

    def __getitem__(self, index):
        if self.array is None:
            from gguf.quants import dequantize

            t = self.tensor
            x = dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in t.shape[::-1]))
            self.array = x if self.heads is None else unpermute_rotary_rows(x, self.heads)
        return self.array[index]


class GGUFSource(hfc.TensorSource):
    """The tensors of a GGUF file for :func:`models.hf_checkpoint.build_params`, under their
    llama.cpp names, read in the Hugging Face layout (dequantized to float32, the query and key
    rows of architecture ``llama`` unpermuted)."""

    def __init__(self, path: str, reader, cfg: LlamaConfig, permuted: bool):
        self.where = path
        self.config_name = "its GGUF metadata"
        self.reader = reader
        self.permuted = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads} if permuted else {}

    def name(self, hf_name: str) -> str:
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
        if m:
            return f"blk.{m[1]}.{_LAYER_NAMES[m[2]]}"
        return _GLOBAL_NAMES[hf_name]

    def headers(self) -> dict[str, hfc.TensorHeader]:
        return {t.name: hfc.TensorHeader(tuple(int(d) for d in t.shape[::-1]),
                                         t.tensor_type.name, self.where)
                for t in self.reader.tensors}

    def dtype_error(self, name: str, header: hfc.TensorHeader) -> str | None:
        if header.dtype in SUPPORTED_TYPES:
            return None
        return (f"{self.where}: tensor {name} has type {header.dtype}, which is not supported; "
                f"supported: {', '.join(SUPPORTED_TYPES)}")

    @contextlib.contextmanager
    def open(self, file: str):
        tensors = {t.name: t for t in self.reader.tensors}

        def get(name: str) -> _Dequantized:
            kind = name.split(".")[-2] if name.startswith("blk.") else ""
            return _Dequantized(tensors[name], self.permuted.get(kind))

        yield get


def load_checkpoint(path: str, *, dtype: Any = "float32", mesh: jax.sharding.Mesh | None = None,
                    rules: dict[str, str | None] = shd.RULES, max_len: int | None = None,
                    memory_limit_bytes: int | None = None) -> hfc.Checkpoint:
    """Loads a Llama / Qwen2 / Mistral GGUF file into :class:`models.llama.Llama`.

    Each tensor is dequantized to float32 on the host (``gguf.quants.dequantize``), its rows
    unpermuted where llama.cpp permuted them (:func:`unpermute_rotary_rows`), cast to ``dtype``
    and placed (sharded over ``mesh``) before the next one is read.

    Args:
      path: the ``.gguf`` file.
      dtype, mesh, rules, max_len, memory_limit_bytes: as
        :func:`models.hf_checkpoint.load_checkpoint`.

    Returns:
      :class:`models.hf_checkpoint.Checkpoint` (config, graphdef, params).

    Raises:
      ValueError (naming the file and, where there is one, the tensor): see :func:`open_gguf`,
        :func:`config_from_gguf`, :func:`models.hf_checkpoint.build_params`; a tensor type
        outside :data:`SUPPORTED_TYPES`.
    """
    path = os.fspath(path)
    dt = hfc.resolve_dtype(dtype)
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path=path, dtype=dt, max_len=max_len)
    arch = reader.fields["general.architecture"].contents()
    return hfc.build_params(cfg, GGUFSource(path, reader, cfg, permuted=arch == "llama"),
                            dtype=dt, mesh=mesh, rules=rules,
                            memory_limit_bytes=memory_limit_bytes)


# ----------------------------------------------------------------------------------------------
# Tokenizer


def _pre_tokenizer(splits: tuple[str | None, ...]):
    from tokenizers import Regex, pre_tokenizers

    steps = []
    for pattern in splits:
        if pattern is None:  # GPT-2's split is ByteLevel's own regex
            steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        else:
            steps.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if splits[-1] is not None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def load_tokenizer(path: str) -> hfc.Tokenizer:
    """The tokenizer of a GGUF file, from its metadata, as :class:`models.hf_checkpoint.Tokenizer`.

    Byte-level BPE (``tokenizer.ggml.model == "gpt2"``): ``tokens`` (id order), ``merges``,
    ``token_type`` (control tokens are special tokens, user-defined ones added tokens, both
    matched whole), the pre-tokenizer ``pre`` (:data:`PRE_TOKENIZERS`), ``add_bos_token`` /
    ``add_eos_token`` (absent = false) with ``bos_token_id`` / ``eos_token_id``, and
    ``tokenizer.chat_template``. Generation stops at ``eos_token_id`` and, when given,
    ``eot_token_id`` and ``eom_token_id``.

    Raises:
      ValueError (naming the file): see :func:`open_gguf`; no tokenizer in the metadata, a
        tokenizer type other than ``gpt2`` or a pre-tokenizer not in :data:`PRE_TOKENIZERS`,
        malformed merges, a special id outside the vocabulary.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    path = os.fspath(path)
    reader = open_gguf(path)
    meta = metadata(reader)
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        raise ValueError(f"{path}: no tokenizer in the GGUF metadata (tokenizer.ggml.model)")
    if kind != "gpt2":
        raise ValueError(f"{path}: tokenizer type {kind!r} (tokenizer.ggml.model) is not "
                         "supported; supported: 'gpt2' (byte-level BPE)")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    pre = "gpt-2" if pre == "default" else pre
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"{path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
                         f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens = _array(reader, "tokenizer.ggml.tokens")
    merges = _array(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise ValueError(f"{path}: tokenizer.ggml.tokens / tokenizer.ggml.merges missing from "
                         "the GGUF metadata")
    types = _array(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    pairs = [tuple(m.split(" ")) for m in merges]
    bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
    if bad is not None:
        raise ValueError(f"{path}: merge {bad!r} in tokenizer.ggml.merges is not two symbols "
                         "separated by one space")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre in _IGNORE_MERGES))
    backend.pre_tokenizer = _pre_tokenizer(PRE_TOKENIZERS[pre])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(tok, normalized=False, special=True)
                                for tok, t in zip(tokens, types) if t == _CONTROL])
    backend.add_tokens([AddedToken(tok, normalized=False, special=False)
                        for tok, t in zip(tokens, types) if t == _USER_DEFINED])

    def special(key: str) -> int | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is not None and not 0 <= int(i) < len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{key} = {i} is outside the vocabulary of "
                             f"{len(tokens)}")
        return None if i is None else int(i)

    bos, eos = special("bos_token_id"), special("eos_token_id")
    template = []
    for flag, tid, where in (("add_bos_token", bos, "front"), ("add_eos_token", eos, "end")):
        if meta.get(f"tokenizer.ggml.{flag}", False):
            if tid is None:
                raise ValueError(f"{path}: tokenizer.ggml.{flag} is set but its token id is "
                                 "missing")
            template.append((where, tokens[tid], tid))
    if template:
        front = [f"{t}" for w, t, _ in template if w == "front"]
        end = [f"{t}" for w, t, _ in template if w == "end"]
        backend.post_processor = processors.TemplateProcessing(
            single=" ".join([*front, "$A", *end]),
            pair=" ".join([*front, "$A", *end, *front, "$B:1", *end]) + "",
            special_tokens=sorted({(t, i) for _, t, i in template}))
    stops = [i for i in (eos, special("eot_token_id"), special("eom_token_id")) if i is not None]
    chat = meta.get("tokenizer.chat_template")
    return hfc.Tokenizer(backend, tuple(dict.fromkeys(stops)),
                         chat_template=chat if isinstance(chat, str) else None,
                         bos_token=None if bos is None else tokens[bos],
                         eos_token=None if eos is None else tokens[eos])
