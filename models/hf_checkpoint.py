"""Llama-family checkpoints from a local Hugging Face directory: config, weights, tokenizer.

A directory holds ``config.json``, the weights as ``model.safetensors`` or shards listed in
``model.safetensors.index.json`` (any ``*.safetensors`` otherwise), and ``tokenizer.json``.
Nothing is downloaded: the directory must already be on disk.

* :func:`config_from_hf` maps ``config.json`` (both the ``rope_theta`` / ``rope_scaling`` schema and
  the newer ``rope_parameters`` one) to :class:`models.llama.LlamaConfig`. A key the file lacks
  means what it means to the reference implementation (``transformers``' config class of the
  model type): :data:`HF_DEFAULTS`, e.g. Qwen2's ``max_window_layers`` 28 and Mistral's
  ``sliding_window`` 4096.
* :func:`load_checkpoint` builds the model's parameters tensor by tensor: the model is created
  abstractly (no random initialisation), every tensor is checked against the model before any is
  read (name, shape, dtype, the memory it needs), then each is read, transposed, cast and placed on
  its devices (sharded by the logical-axis rules of :mod:`core.sharding` when a mesh is given, each
  device reading only its slice) before the next one is read. The host never holds a second copy
  of the model. Name mapping and transposes are the one table :data:`WEIGHTS`. The builder,
  :func:`build_params`, reads through a :class:`TensorSource`; GGUF files
  (:mod:`models.gguf_checkpoint`) are another source for the same builder.
* :func:`load_tokenizer` wraps ``tokenizer.json`` with the ``tokenizers`` library;
  :meth:`Tokenizer.encode_prompt` never puts the BOS twice nor ends a prompt in the EOS a
  ``<s> $A </s>`` template appends, :meth:`Tokenizer.apply_chat_template` renders the chat
  template of ``tokenizer_config.json`` / ``chat_template.jinja``,
  :meth:`Tokenizer.decode_continuation` decodes generated ids in the context of their prompt.

Every bad input raises a one-line ValueError that names the file and, where there is one, the
tensor; nothing partially loaded is returned.

Dimensions: V vocabulary, E model width, H query heads, K kv heads, D head dim, F MLP width.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import glob
import json
import os
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core import sharding as shd
from models.llama import Llama, LlamaConfig
from models.rope import ROPE_KINDS, RotaryEmbedding

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

# What the reference implementation (the `transformers` config classes LlamaConfig, MistralConfig
# and Qwen2Config, and their modeling code) assumes for each config.json key read here when the key
# is absent. A key missing from a model type's row is one that model type's reference ignores
# (e.g. Qwen2's attention biases are fixed, Llama has no sliding window). None for
# num_key_value_heads / head_dim means derived: H, and E // H.
_BASE_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
    head_dim=None, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_theta=10_000.0, partial_rotary_factor=1.0, eos_token_id=2)
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_BASE_DEFAULTS, "intermediate_size": 11008, "num_key_value_heads": None,
              "max_position_embeddings": 2048, "attention_bias": False, "mlp_bias": False},
    "mistral": {**_BASE_DEFAULTS, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
    "qwen2": {**_BASE_DEFAULTS, "vocab_size": 151936, "intermediate_size": 22016,
              "num_key_value_heads": 32, "max_position_embeddings": 32768, "eos_token_id": None,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
}

# (our parameter path, with {i} for the layer; Hugging Face tensor name; transpose (HF stores
#  Linear weights [out, in], we store kernels [in, out]); logical axes of our array)
WEIGHTS: tuple[tuple[str, str, bool, tuple[str, ...]], ...] = (
    ("embed.embedding", "model.embed_tokens.weight", False, ("vocab", "embed")),
    ("blocks.{i}.norm1.scale", "model.layers.{i}.input_layernorm.weight", False, ("embed",)),
    ("blocks.{i}.attn.q_proj.kernel", "model.layers.{i}.self_attn.q_proj.weight", True,
     ("embed", "heads")),
    ("blocks.{i}.attn.q_proj.bias", "model.layers.{i}.self_attn.q_proj.bias", False, ("heads",)),
    ("blocks.{i}.attn.k_proj.kernel", "model.layers.{i}.self_attn.k_proj.weight", True,
     ("embed", "kv_heads")),
    ("blocks.{i}.attn.k_proj.bias", "model.layers.{i}.self_attn.k_proj.bias", False,
     ("kv_heads",)),
    ("blocks.{i}.attn.v_proj.kernel", "model.layers.{i}.self_attn.v_proj.weight", True,
     ("embed", "kv_heads")),
    ("blocks.{i}.attn.v_proj.bias", "model.layers.{i}.self_attn.v_proj.bias", False,
     ("kv_heads",)),
    ("blocks.{i}.attn.o_proj.kernel", "model.layers.{i}.self_attn.o_proj.weight", True,
     ("heads", "embed")),
    ("blocks.{i}.attn.o_proj.bias", "model.layers.{i}.self_attn.o_proj.bias", False, ("embed",)),
    ("blocks.{i}.norm2.scale", "model.layers.{i}.post_attention_layernorm.weight", False,
     ("embed",)),
    ("blocks.{i}.mlp.gate.kernel", "model.layers.{i}.mlp.gate_proj.weight", True,
     ("embed", "mlp")),
    ("blocks.{i}.mlp.up.kernel", "model.layers.{i}.mlp.up_proj.weight", True, ("embed", "mlp")),
    ("blocks.{i}.mlp.down.kernel", "model.layers.{i}.mlp.down_proj.weight", True,
     ("mlp", "embed")),
    ("final_norm.scale", "model.norm.weight", False, ("embed",)),
    ("head.kernel", "lm_head.weight", True, ("embed", "vocab")),
)

# Checkpoint tensors that carry no parameter (recomputed buffers of older exports).
_IGNORED = re.compile(r".*\.rotary_emb\.inv_freq$")
_FLOAT_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16}
LOAD_DTYPES = ("float32", "bfloat16", "float16")


class Checkpoint(NamedTuple):
    """A loaded model: ``nnx.merge(graphdef, params)`` is a :class:`models.llama.Llama`."""

    config: LlamaConfig
    graphdef: nnx.GraphDef
    params: nnx.State


# ----------------------------------------------------------------------------------------------
# config.json


def read_json(path: str) -> dict:
    """The JSON object in ``path``.

    Raises:
      ValueError: missing file, invalid JSON (with its line) or not an object.
    """
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _hf_value(hf: dict, key: str) -> Any:
    """``hf[key]``, or the reference default of ``hf``'s model type when the key is absent."""
    return hf[key] if key in hf else HF_DEFAULTS[hf["model_type"]][key]


# RoPE keys the reference requires in rope_parameters / rope_scaling for each type (it refuses a
# config without them; rope_theta and original_max_position_embeddings have defaults).
_ROPE_REQUIRED = {"default": (), "linear": ("factor",), "yarn": ("factor",),
                  "llama3": ("factor", "low_freq_factor", "high_freq_factor")}


def _rope_from_hf(hf: dict, where: str) -> RotaryEmbedding:
    params = hf.get("rope_parameters")
    if params is not None and any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{where}: per-layer-type rope_parameters ({sorted(params)}) are not "
                         "supported")
    # The reference reads a legacy rope_scaling in preference to rope_parameters.
    scaling = dict(hf.get("rope_scaling") or params or {})
    theta = scaling.get("rope_theta", _hf_value(hf, "rope_theta"))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise ValueError(f"{where}: rope type {kind!r} is not supported; supported: "
                         f"{', '.join(ROPE_KINDS)}")
    missing = [k for k in _ROPE_REQUIRED[kind] if k not in scaling]
    if missing:
        raise ValueError(f"{where}: rope type {kind!r} needs {', '.join(missing)} in "
                         "rope_parameters / rope_scaling")
    if scaling.get("partial_rotary_factor", _hf_value(hf, "partial_rotary_factor")) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor != 1 is not supported")
    max_pos = _hf_value(hf, "max_position_embeddings")
    orig = scaling.get("original_max_position_embeddings", max_pos)
    factor = scaling.get("factor", 1.0)
    if factor is None and kind == "yarn" and max_pos and orig:
        factor = max_pos / orig  # the reference's implicit YaRN factor
    if factor is None and kind != "default":
        raise ValueError(f"{where}: rope type {kind!r} needs a numeric factor, got null")
    kwargs = dict(theta=float(theta), kind=kind, factor=float(factor or 1.0))
    if kind in ("llama3", "yarn"):
        kwargs["original_max_len"] = int(orig) if orig else None
    if kind == "llama3":
        kwargs.update(low_freq_factor=float(scaling["low_freq_factor"]),
                      high_freq_factor=float(scaling["high_freq_factor"]))
    if kind == "yarn":
        kwargs.update(beta_fast=float(scaling.get("beta_fast") or 32.0),
                      beta_slow=float(scaling.get("beta_slow") or 1.0),
                      attention_factor=scaling.get("attention_factor"),
                      mscale=scaling.get("mscale"), mscale_all_dim=scaling.get("mscale_all_dim"),
                      truncate=bool(scaling.get("truncate", True)))
    try:
        return RotaryEmbedding(**kwargs)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


def _windows_from_hf(hf: dict, n: int, where: str) -> tuple[int | None, ...] | None:
    """Per-layer sliding windows as the reference models apply them.

    Llama has none (``sliding_window`` / ``layer_types`` are ignored); Mistral windows every layer
    by ``sliding_window`` (default 4096; ``null`` = none; ``layer_types`` ignored); Qwen2 windows
    by ``sliding_window`` (default 4096) only when ``use_sliding_window`` (default false), the
    ``sliding_attention`` entries of ``layer_types`` when given, else layers
    ``i >= max_window_layers`` (default 28).
    """
    model_type = hf["model_type"]
    if model_type == "llama":
        return None
    window = _hf_value(hf, "sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool)
                               or window < 1):
        raise ValueError(f"{where}: sliding_window must be a positive integer or null, got "
                         f"{window!r}")
    if model_type == "mistral":
        return None if window is None else (window,) * n
    if not _hf_value(hf, "use_sliding_window"):
        window = None
    layer_types = hf.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n:
            raise ValueError(f"{where}: layer_types must be a list of num_hidden_layers={n} "
                             f"entries, got {layer_types!r}")
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(f"{where}: layer type(s) {unknown} are not supported")
        if "sliding_attention" in layer_types and window is None:
            raise ValueError(f"{where}: layer_types has sliding_attention layers but no window "
                             f"(use_sliding_window={_hf_value(hf, 'use_sliding_window')}, "
                             f"sliding_window={hf.get('sliding_window')})")
        sliding = [t == "sliding_attention" for t in layer_types]
    else:
        first = _hf_value(hf, "max_window_layers")
        if not isinstance(first, int) or isinstance(first, bool):
            raise ValueError(f"{where}: max_window_layers must be an integer, got {first!r}")
        sliding = [window is not None and i >= first for i in range(n)]
    out = tuple(window if s else None for s in sliding)
    return out if any(w is not None for w in out) else None


def config_from_hf(hf: dict, *, where: str = "config.json", dtype: Any = jnp.float32,
                   max_len: int | None = None) -> LlamaConfig:
    """:class:`LlamaConfig` of a Hugging Face ``config.json`` object.

    A key that ``hf`` lacks takes the value the reference implementation (``transformers``'
    config class of that model type) gives it: :data:`HF_DEFAULTS`. Keys the reference ignores
    for a model type are ignored here too (Qwen2's and Mistral's ``attention_bias`` /
    ``mlp_bias``, Llama's ``sliding_window``, Llama's and Mistral's ``layer_types``).

    Args:
      hf: the parsed ``config.json``.
      where: the file name used in error messages.
      dtype: parameter and computation dtype.
      max_len: override of ``max_position_embeddings`` (the longest cache the model accepts).

    Raises:
      ValueError (naming ``where``): unsupported ``model_type`` or activation, MLP biases, an
        unsupported RoPE type or scaling or one missing a key its type needs, a non-positive or
        non-integer size, an invalid sliding-window setting.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    act = _hf_value(hf, "hidden_act")
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
    if model_type == "llama" and _hf_value(hf, "mlp_bias"):
        raise ValueError(f"{where}: mlp_bias=true is not supported")
    sizes = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads"] + ([] if max_len else ["max_position_embeddings"])
    for key in sizes:
        value = _hf_value(hf, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}: {key} must be a positive integer, got {value!r}")
    n = _hf_value(hf, "num_hidden_layers")
    heads = _hf_value(hf, "num_attention_heads")
    # Only Llama reads attention_bias; Qwen2 always has q/k/v biases and none on o_proj.
    attention_bias = model_type == "llama" and bool(_hf_value(hf, "attention_bias"))
    try:
        return LlamaConfig(
            vocab_size=_hf_value(hf, "vocab_size"),
            max_len=int(max_len or _hf_value(hf, "max_position_embeddings")),
            d_model=_hf_value(hf, "hidden_size"), num_layers=n, num_heads=heads,
            num_kv_heads=_hf_value(hf, "num_key_value_heads") or heads,
            mlp_dim=_hf_value(hf, "intermediate_size"), head_dim=_hf_value(hf, "head_dim"),
            rope=_rope_from_hf(hf, where), norm_eps=float(_hf_value(hf, "rms_norm_eps")),
            qkv_bias=model_type == "qwen2" or attention_bias, out_bias=attention_bias,
            tie_embeddings=bool(_hf_value(hf, "tie_word_embeddings")),
            layer_windows=_windows_from_hf(hf, n, where),
            dtype=dtype, param_dtype=dtype, model_type=model_type)
    except ValueError as e:
        if str(e).startswith(where):
            raise
        raise ValueError(f"{where}: {e}") from None


def read_config(path: str, *, dtype: Any = jnp.float32, max_len: int | None = None
                ) -> LlamaConfig:
    """:func:`config_from_hf` of ``<path>/config.json``.

    Raises:
      ValueError: ``path`` is not a directory, has no ``config.json``, or as ``config_from_hf``.
    """
    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a checkpoint directory")
    file = os.path.join(path, "config.json")
    return config_from_hf(read_json(file), where=file, dtype=dtype, max_len=max_len)


# ----------------------------------------------------------------------------------------------
# Weights


def weight_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file of the checkpoint in directory ``path``.

    Uses ``model.safetensors.index.json`` when present (its ``weight_map``), else every
    ``*.safetensors`` file in the directory.

    Raises:
      ValueError: no weights, only PyTorch ``.bin`` weights, an index naming a missing shard, a
        tensor in two files, or a file that is not a valid safetensors file.
    """
    from safetensors import SafetensorError, safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no weight_map")
        files = sorted({os.path.join(path, f) for f in weight_map.values()})
        for f in files:
            if not os.path.isfile(f):
                raise ValueError(f"{index}: shard {os.path.basename(f)} does not exist")
    else:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            other = glob.glob(os.path.join(path, "*.bin")) + glob.glob(os.path.join(path, "*.pt"))
            extra = " (only PyTorch .bin/.pt weights found; convert them to safetensors)" \
                if other else ""
            raise ValueError(f"{path}: no *.safetensors weights{extra}")
    where: dict[str, str] = {}
    for f in files:
        try:
            with safe_open(f, framework="flax") as st:
                names = list(st.keys())
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
        for name in names:
            if name in where:
                raise ValueError(f"{f}: tensor {name} is also in {where[name]}")
            where[name] = f
    return where


def _table(cfg: LlamaConfig) -> dict[tuple, tuple[str, bool, tuple[str, ...]]]:
    """Our flat parameter path -> (HF name, transpose, logical axes), for this config."""
    out = {}
    for ours, theirs, transpose, axes in WEIGHTS:
        layers = range(cfg.num_layers) if "{i}" in ours else [None]
        for i in layers:
            path = tuple(int(p) if p.isdigit() else p for p in ours.format(i=i).split("."))
            out[path] = (theirs.format(i=i), transpose, axes)
    return out


def _sharding_for(shape: tuple[int, ...], axes: tuple[str, ...], mesh, rules
                  ) -> jax.sharding.Sharding:
    if mesh is None:
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])
    spec = list(shd.logical_to_spec(axes, rules))
    for d, name in enumerate(spec):  # a dimension that does not divide stays replicated
        if name is not None and shape[d] % mesh.shape[name]:
            spec[d] = None
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def _memory_capacity(mesh) -> tuple[int | None, str]:
    devices = list(mesh.devices.flat) if mesh is not None else [jax.devices()[0]]
    stats = [d.memory_stats() if hasattr(d, "memory_stats") else None for d in devices]
    if all(s and s.get("bytes_limit") for s in stats):
        return (sum(int(s["bytes_limit"]) - int(s.get("bytes_in_use", 0)) for s in stats),
                f"free memory of {len(devices)} device(s)")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory"
    except OSError:
        pass
    return None, ""


def resolve_dtype(dtype: Any) -> np.dtype:
    """The parameter dtype for a name or dtype in :data:`LOAD_DTYPES`.

    Raises:
      ValueError: any other dtype (e.g. float64, which JAX holds as float32 unless x64 is on, or
        an integer type).
    """
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype {dtype!r}: not a dtype; expected one of {LOAD_DTYPES}") from None
    if dt.name not in LOAD_DTYPES:
        raise ValueError(f"dtype {dt.name}: parameters can be loaded as {', '.join(LOAD_DTYPES)} "
                         "only")
    return dt


class TensorHeader(NamedTuple):
    """One stored tensor as its checkpoint describes it, before any of it is read.

    Attributes:
      shape: its shape in the Hugging Face layout (a Linear weight is [out, in]).
      dtype: the storage type's name in the file's own vocabulary (``"BF16"``, ``"Q4_1"``).
      file: the file that holds it (named in error messages).
    """

    shape: tuple[int, ...]
    dtype: str
    file: str


class TensorSource(abc.ABC):
    """Where the tensors of a checkpoint come from: one implementation per file format.

    :func:`build_params` asks a source for every tensor's :class:`TensorHeader` (checked against
    the model before anything is read), then for one tensor at a time in the Hugging Face layout.

    Attributes:
      where: the checkpoint (a directory or a file), named in error messages.
      config_name: what the config was read from (``"config.json"``), named in error messages.
    """

    where: str = ""
    config_name: str = "config.json"

    def name(self, hf_name: str) -> str:
        """The source's name of the tensor that Hugging Face calls ``hf_name``."""
        return hf_name

    @abc.abstractmethod
    def headers(self) -> dict[str, TensorHeader]:
        """Every stored tensor, by the source's name."""

    @abc.abstractmethod
    def dtype_error(self, name: str, header: TensorHeader) -> str | None:
        """Why ``name``'s storage type cannot be read (a message), or None when it can."""

    def ignored(self, name: str) -> bool:
        """True for a stored tensor that carries no parameter (e.g. a recomputed buffer)."""
        return False

    @abc.abstractmethod
    def open(self, file: str) -> contextlib.AbstractContextManager[Callable[[str], Any]]:
        """A context in which ``get(name)`` returns tensor ``name`` of ``file`` as an object that
        numpy-style basic indexing (a tuple of slices, or ``[:]``) reads into a host array in the
        Hugging Face layout."""


class SafetensorsSource(TensorSource):
    """The ``*.safetensors`` files of a Hugging Face checkpoint directory (see
    :func:`weight_files`); each device reads only its slice of a tensor."""

    def __init__(self, path: str):
        self.where = path
        self.files = weight_files(path)

    def headers(self) -> dict[str, TensorHeader]:
        from safetensors import safe_open

        out: dict[str, TensorHeader] = {}
        for f in sorted(set(self.files.values())):
            with safe_open(f, framework="flax") as st:
                for name in st.keys():
                    sl = st.get_slice(name)
                    out[name] = TensorHeader(tuple(sl.get_shape()), sl.get_dtype(), f)
        return out

    def dtype_error(self, name: str, header: TensorHeader) -> str | None:
        if header.dtype in _FLOAT_DTYPES:
            return None
        return (f"{header.file}: tensor {name} has dtype {header.dtype}; expected one of "
                f"{', '.join(_FLOAT_DTYPES)} (quantized checkpoints are not supported)")

    def ignored(self, name: str) -> bool:
        return bool(_IGNORED.match(name))

    @contextlib.contextmanager
    def open(self, file: str):
        from safetensors import safe_open

        with safe_open(file, framework="flax") as st:
            yield st.get_slice


def build_params(cfg: LlamaConfig, source: TensorSource, *, dtype: Any = "float32",
                 mesh: jax.sharding.Mesh | None = None,
                 rules: dict[str, str | None] = shd.RULES,
                 memory_limit_bytes: int | None = None) -> Checkpoint:
    """Builds the parameters of :class:`models.llama.Llama` ``cfg`` from ``source``'s tensors.

    The model is created abstractly (no random initialisation); every tensor is checked against
    it before any is read (name, shape, storage type, the memory the parameters need); then each
    is read, transposed (:data:`WEIGHTS`), cast to ``dtype`` and placed on its devices before the
    next one is read, so the host never holds a second copy of the model.

    Args:
      cfg: the model's config (its ``param_dtype`` should be ``dtype``).
      source: the checkpoint's tensors (:class:`SafetensorsSource`,
        :class:`models.gguf_checkpoint.GGUFSource`).
      dtype: parameter dtype, one of :data:`LOAD_DTYPES`.
      mesh, rules, memory_limit_bytes: as :func:`load_checkpoint`.

    Returns:
      :class:`Checkpoint` (``cfg``, graphdef, params).

    Raises:
      ValueError (naming the file and the tensor): a tensor the model needs is missing, has the
        wrong shape or a storage type the source cannot read; a stored tensor the model does not
        use; ``dtype`` not loadable; the parameters do not fit in memory.
    """
    dt = resolve_dtype(dtype)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Llama(cfg, rngs=nnx.Rngs(0))))
    table = _table(cfg)
    flat = list(nnx.to_flat_state(abstract))
    where, config_name = source.where, source.config_name

    # 1. Check every tensor before reading any.
    headers = source.headers()
    plan = []
    used = set()
    for p, var in flat:
        if p not in table:
            raise ValueError(f"{where}: model parameter {'.'.join(map(str, p))} has no entry in "
                             "the weight table")
        hf_name, transpose, axes = table[p]
        name = source.name(hf_name)
        if name not in headers:
            raise ValueError(f"{where}: tensor {name} is missing from the checkpoint")
        header = headers[name]
        want = tuple(var.shape[::-1] if transpose else var.shape)
        if tuple(header.shape) != want:
            raise ValueError(f"{header.file}: tensor {name} has shape {tuple(header.shape)}, "
                             f"expected {want} for {config_name}")
        error = source.dtype_error(name, header)
        if error:
            raise ValueError(error)
        used.add(name)
        plan.append((p, var, name, transpose, axes))
    head = source.name("lm_head.weight")
    unused = sorted(n for n in headers if n not in used and not source.ignored(n)
                    and not (cfg.tie_embeddings and n == head))
    if unused:
        raise ValueError(f"{headers[unused[0]].file}: tensor {unused[0]} is not used by the "
                         f"{cfg.model_type} model built from {config_name} ({len(unused)} such "
                         "tensors)")
    need = sum(int(np.prod(var.shape)) for _, var, *_ in plan) * dt.itemsize
    cap, what = ((memory_limit_bytes, "memory_limit_bytes") if memory_limit_bytes is not None
                 else _memory_capacity(mesh))
    if cap is not None and need > cap:
        raise ValueError(f"{where}: the parameters need {need / 2**30:.2f} GiB as {dt.name}, more "
                         f"than the {what} ({cap / 2**30:.2f} GiB)")

    # 2. Read, transpose, cast and place one tensor at a time.
    cpu = jax.local_devices(backend="cpu")[0]
    values: dict[tuple, jax.Array] = {}
    by_file: dict[str, list] = {}
    for item in plan:
        by_file.setdefault(headers[item[2]].file, []).append(item)
    for f, items in by_file.items():
        with source.open(f) as get:
            for p, var, name, transpose, axes in items:
                sl = get(name)

                def read(index, sl=sl, transpose=transpose):
                    index = tuple(index)[::-1] if transpose else tuple(index)
                    with jax.default_device(cpu):
                        x = sl[index] if index else sl[:]
                        return (x.T if transpose else x).astype(dt)

                values[p] = jax.make_array_from_callback(
                    tuple(var.shape), _sharding_for(tuple(var.shape), axes, mesh, rules), read)
                del sl
    params = nnx.from_flat_state([(p, var.replace(values[p])) for p, var in flat])
    return Checkpoint(cfg, graphdef, params)


def load_checkpoint(path: str, *, dtype: Any = "float32", mesh: jax.sharding.Mesh | None = None,
                    rules: dict[str, str | None] = shd.RULES, max_len: int | None = None,
                    memory_limit_bytes: int | None = None) -> Checkpoint:
    """Loads a Llama / Qwen2 / Mistral checkpoint directory into :class:`models.llama.Llama`.

    Args:
      path: directory with ``config.json`` and safetensors weights.
      dtype: parameter (and computation) dtype, one of :data:`LOAD_DTYPES`; tensors are cast.
      mesh: place each tensor sharded over this mesh as it loads (logical axes of
        :data:`WEIGHTS` mapped by ``rules``; a dimension the mesh axis does not divide is
        replicated); default: the first device.
      rules: logical axis -> mesh axis (default :data:`core.sharding.RULES`).
      max_len: longest sequence / cache (default ``max_position_embeddings``).
      memory_limit_bytes: memory the parameters may take (default: the devices' free memory, or
        the host's available memory on CPU).

    Returns:
      :class:`Checkpoint` (config, graphdef, params).

    Raises:
      ValueError (naming the file and the tensor): see :func:`read_config`,
        :func:`weight_files`, :func:`build_params` (a tensor missing, of the wrong shape, of a
        non-float dtype or unused; ``dtype`` not loadable; not enough memory).
    """
    dt = resolve_dtype(dtype)
    cfg = read_config(path, dtype=dt, max_len=max_len)
    return build_params(cfg, SafetensorsSource(path), dtype=dt, mesh=mesh, rules=rules,
                        memory_limit_bytes=memory_limit_bytes)


# ----------------------------------------------------------------------------------------------
# Tokenizer


class EncodedPrompt(NamedTuple):
    """A prompt's token ids, and what :meth:`Tokenizer.encode_prompt` took off its ends.

    Attributes:
      ids: the ids to feed the model.
      prefix_dropped: leading ids dropped (a copy of the BOS the text already begins with).
      suffix_dropped: trailing ids dropped (the EOS a ``$A </s>`` template appends).
    """

    ids: list[int]
    prefix_dropped: int = 0
    suffix_dropped: int = 0


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """A ``tokenizers`` tokenizer with the checkpoint's EOS ids and chat template.

    Attributes:
      backend: the ``tokenizers.Tokenizer`` (``tokenizer.json``, or built from a GGUF file's
        metadata by :func:`models.gguf_checkpoint.load_tokenizer`).
      eos_ids: ids that end generation (``generation_config.json``'s ``eos_token_id``, else
        ``config.json``'s, else the reference default of its model type, :data:`HF_DEFAULTS`;
        an int or a list in either).
      chat_template: the Jinja chat template (``tokenizer_config.json``'s ``chat_template`` or
        ``chat_template.jinja``; a GGUF file's ``tokenizer.chat_template``), or None.
      bos_token, eos_token: the BOS / EOS token texts the template may use, or None.
    """

    backend: Any
    eos_ids: tuple[int, ...] = ()
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with the tokenizer's own post-processing, e.g. a BOS id)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (a sequence of ints)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def encode_prompt(self, text: str) -> EncodedPrompt:
        """Token ids of a prompt to continue: the post-processing's prefix (e.g. BOS) exactly
        once, and none of its suffix.

        A prompt that already begins with the prefix's text (a chat template's output starts
        with ``<s>`` or ``<|begin_of_text|>``) would otherwise get it twice, ``[BOS, BOS, ...]``:
        then the added copy is dropped and the ids are those of the text alone. A template that
        appends ids after the text (``<s> $A </s>``) would end every prompt in EOS, which tells
        the model the text is over: those ids are dropped. A template that adds nothing leaves
        the ids as the tokenizer gives them.

        Returns:
          :class:`EncodedPrompt` (ids, leading ids dropped: 0 or len(prefix), trailing ids
          dropped: 0 or len(suffix)).
        """
        ids = self.encode(text)
        suffix = list(self.suffix_ids())
        n = len(suffix)
        cut = n if n and len(ids) >= n and ids[-n:] == suffix else 0
        ids = ids[:len(ids) - cut]
        prefix = list(self.prefix_ids())
        k = len(prefix)
        if k and ids[:k] == prefix and ids[k:2 * k] == prefix:
            plain = self.encode(text, add_special_tokens=False)
            if plain[:k] == prefix:  # the text itself begins with the prefix
                return EncodedPrompt(ids[k:], k, cut)
        return EncodedPrompt(ids, 0, cut)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> str:
        """The text of a conversation in the checkpoint's chat format.

        Renders :attr:`chat_template` (Jinja, in a sandbox, with ``trim_blocks`` and
        ``lstrip_blocks`` as Hugging Face's ``apply_chat_template`` renders it) with
        ``messages`` (dicts with ``role`` and ``content``), ``add_generation_prompt``,
        ``bos_token`` and ``eos_token``. Encode the result with :meth:`encode_prompt`.

        Raises:
          ValueError: the tokenizer has no chat template, or the template fails
            (its ``raise_exception`` or a Jinja error, in one line).
        """
        if not self.chat_template:
            raise ValueError("the checkpoint's tokenizer has no chat template")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"chat template: {str(e).splitlines()[0] if str(e) else e!r}"
                             ) from None

    def decode_continuation(self, prompt_ids, new_ids) -> str:
        """Text of ``new_ids`` as a continuation of ``prompt_ids``.

        Decoding ``new_ids`` alone loses context-dependent text: a Metaspace (SentencePiece
        ``▁``) decoder strips the leading space of the first token it decodes, so the
        continuation " is nobler" of "to be or" would come back as "is nobler". This returns
        ``decode(prompt_ids + new_ids)`` minus its prefix ``decode(prompt_ids)``, so that
        ``decode(prompt_ids) + text == decode(prompt_ids + new_ids)``. Where the full text does
        not begin with the prompt's text (a decoder that rewrites across the boundary), the
        continuation starts after their longest common prefix.
        """
        head = self.decode(prompt_ids)
        full = self.decode(list(prompt_ids) + list(new_ids))
        if full.startswith(head):
            return full[len(head):]
        common = 0
        for a, b in zip(head, full):
            if a != b:
                break
            common += 1
        return full[common:]

    def _template_ends(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        plain = self.encode("a", add_special_tokens=False)
        full = self.encode("a", add_special_tokens=True)
        for i in range(len(full) - len(plain) + 1):
            if full[i:i + len(plain)] == plain:
                return tuple(full[:i]), tuple(full[i + len(plain):])
        return (), ()

    def prefix_ids(self) -> tuple[int, ...]:
        """The special ids the tokenizer's post-processing puts before a text (e.g. Llama's BOS;
        ``()`` for Qwen2): what :meth:`encode` with special tokens adds in front of the plain ids
        of a one-letter text. Windows cut from a long tokenized text start with these so the model
        sees the start of a sequence as it was trained to."""
        return self._template_ends()[0]

    def suffix_ids(self) -> tuple[int, ...]:
        """The special ids the post-processing puts after a text (e.g. ``</s>`` of a
        ``<s> $A </s>`` template; usually ``()``), found as :meth:`prefix_ids`."""
        return self._template_ends()[1]


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of checkpoint directory ``path`` (``tokenizer.json``).

    Raises:
      ValueError: ``path`` is not a directory, has no ``tokenizer.json`` or one the library
        cannot parse (naming the file).
    """
    from tokenizers import Tokenizer as HFTokenizer

    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a checkpoint directory")
    file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        raise ValueError(f"{file}: no such file (a tokenizer.json is needed to encode prompts)")
    try:
        backend = HFTokenizer.from_file(file)
    except Exception as e:  # noqa: BLE001 - the library raises plain Exception on bad files
        raise ValueError(f"{file}: not a valid tokenizer.json ({str(e).splitlines()[0]})") from None
    eos: Any = None
    eos_file = gen_file = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_file):
        eos = read_json(gen_file).get("eos_token_id")
    cfg_file = os.path.join(path, "config.json")
    if eos is None and os.path.isfile(cfg_file):
        hf, eos_file = read_json(cfg_file), cfg_file
        eos = (HF_DEFAULTS[hf["model_type"]]["eos_token_id"]
               if "eos_token_id" not in hf and hf.get("model_type") in HF_DEFAULTS
               else hf.get("eos_token_id"))
    return Tokenizer(backend, _eos_ids(eos, eos_file), *_chat_template(path))


def _chat_template(path: str) -> tuple[str | None, str | None, str | None]:
    """(chat template, BOS text, EOS text) of directory ``path``: ``chat_template.jinja`` or
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates of
    which the one named ``default`` is taken), and its ``bos_token`` / ``eos_token``."""
    file = os.path.join(path, "tokenizer_config.json")
    conf = read_json(file) if os.path.isfile(file) else {}

    def text(token):  # a token is a string or an AddedToken dict with "content"
        return token.get("content") if isinstance(token, dict) else token

    template = conf.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        with open(jinja) as f:
            template = f.read()
    bos, eos = text(conf.get("bos_token")), text(conf.get("eos_token"))
    return (template if isinstance(template, str) else None,
            bos if isinstance(bos, str) else None, eos if isinstance(eos, str) else None)


def _eos_ids(eos: Any, where: str) -> tuple[int, ...]:
    """``eos_token_id`` (null, an id or a list of ids) as a tuple of ids.

    Raises:
      ValueError (naming ``where``): anything else (a string, a float, a negative id).
    """
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{where}: eos_token_id must be a token id, a list of them or null, "
                         f"got {eos!r}")
    return tuple(ids)
