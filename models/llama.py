"""Llama-family decoders (Llama 2/3, Qwen2, Mistral) in Flax NNX, decoding through the KV-cache
backends of :mod:`models.kv_cache`.

Dimensions: B batch, L sequence (query) length, S cache slots, H query heads, K key/value heads
(GQA: H = G * K), D head dim, E model width, F MLP hidden width, V vocabulary, N layers.

Architecture (Touvron et al. 2023, "Llama 2", Sec. 2.2; Qwen2 and Mistral differ only where the
config says): token embedding; N pre-norm blocks (RMSNorm -> grouped-query attention with RoPE ->
residual; RMSNorm -> SwiGLU MLP -> residual); a final RMSNorm; an output head, optionally tied to
the embedding. Options read from a Hugging Face ``config.json`` (:func:`config_from_hf`):

* RoPE with the checkpoint's ``rope_theta`` and its ``rope_scaling`` (linear, Llama-3, YaRN), see
  :class:`models.rope.RotaryEmbedding`; YaRN's attention factor m is folded into the queries
  (q * m^2), so keys stay purely rotated and every cache sees the same keys;
* Qwen2's biases on the q/k/v projections (always, none on the output); Llama's
  ``attention_bias`` puts one on all four projections;
* Mistral's (and Qwen2's per-layer) sliding window: query i sees keys j with i - w < j <= i.

The module tree mirrors :class:`models.transformer.Transformer` (``embed``, ``blocks[i].norm1``,
``.attn.q_proj`` ..., ``final_norm``, ``head``) and so does the interface (``cfg.max_len``,
``cfg.vocab_size``, :meth:`Llama.init_cache`, :meth:`Llama.decode`), so :func:`models.sampling.generate`
and the EntroKV prompt statistics of :mod:`algorithms.kv_budget.cache` work on it unchanged. Use it
functionally: ``graphdef, params = nnx.split(model)``; :mod:`models.hf_checkpoint` builds the
parameters from a checkpoint without materialising a random initialisation.

KV backends: the dense cache honours sliding windows; a windowed layer whose cache is longer than
its window is refused (ValueError) by any other backend, which has no way to forget old slots.
Backends that re-apply RoPE to stored keys (QVG with ``pre_rope``) must be built with the model's
RoPE: :func:`backend_for` does that.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels import attention_math, cache_backend, checks
from kernels.rope import apply_rope
from models import kv_cache as kvc
from models.rope import RotaryEmbedding
from models.transformer import SwiGLU, init_stacked_cache, scan_blocks, scan_blocks_decode
from models.transformer import scanned as transformer_scanned


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Static hyper-parameters of a Llama-family decoder (hashable).

    Attributes:
      vocab_size: V.
      max_len: longest sequence / cache the model accepts (``max_position_embeddings``).
      d_model: E (``hidden_size``).
      num_layers: N.
      num_heads: H.
      num_kv_heads: K; must divide H.
      head_dim: D (even); defaults to E // H.
      mlp_dim: F (``intermediate_size``).
      rope: the rotary embedding (theta and scaling).
      norm_eps: RMSNorm epsilon.
      qkv_bias: biases on the q, k, v projections (Qwen2).
      out_bias: bias on the attention output projection (Llama's ``attention_bias``).
      tie_embeddings: the output head is the transposed token embedding.
      layer_windows: per-layer sliding window w (None = full causal attention) or None for no
        window anywhere; length N when given.
      dtype: computation dtype (activations); logits are float32.
      param_dtype: parameter dtype (bfloat16 halves memory for large checkpoints).
      model_type: the ``model_type`` the config came from (informational).
      scan_layers: store the blocks' parameters stacked along a leading layer axis [N, ...] and
        apply them with one ``lax.scan`` (the compiled program holds one block instead of N, so a
        30-layer model compiles about N times faster); the KV cache is then stacked the same way.
        Same function; :func:`scanned` converts a loaded model. Needs one window for every layer.

    Raises:
      ValueError: a non-positive size, H not a multiple of K, an odd head dim, a window < 1,
        ``layer_windows`` of the wrong length, or ``scan_layers`` with layers of different
        windows.
    """

    vocab_size: int
    max_len: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    mlp_dim: int
    head_dim: int | None = None
    rope: RotaryEmbedding = RotaryEmbedding()
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    out_bias: bool = False
    tie_embeddings: bool = False
    layer_windows: tuple[int | None, ...] | None = None
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    model_type: str = "llama"
    scan_layers: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "max_len", "d_model", "num_layers", "num_heads",
                     "num_kv_heads", "mlp_dim"):
            checks.integer(getattr(self, name), name, "LlamaConfig", minimum=1)
        checks.integer(self.head_dim, "head_dim", "LlamaConfig", minimum=2, allow_none=True)
        checks.number(self.norm_eps, "norm_eps", "LlamaConfig", minimum=0.0, open_min=True)
        for name in ("dtype", "param_dtype"):
            checks.float_dtype(getattr(self, name), name, "LlamaConfig")
        for name in ("vocab_size", "max_len", "d_model", "num_layers", "num_heads",
                     "num_kv_heads", "mlp_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name}={getattr(self, name)}: must be >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"LlamaConfig: d_model={self.d_model} not divisible by "
                             f"num_heads={self.num_heads}; set head_dim")
        if self.dim_per_head < 2 or self.dim_per_head % 2:
            raise ValueError(f"LlamaConfig: head_dim={self.dim_per_head} must be even (RoPE)")
        if self.layer_windows is not None:
            if len(self.layer_windows) != self.num_layers:
                raise ValueError(f"LlamaConfig: layer_windows has {len(self.layer_windows)} "
                                 f"entries for num_layers={self.num_layers}")
            if any(w is not None and w < 1 for w in self.layer_windows):
                raise ValueError(f"LlamaConfig: layer_windows={self.layer_windows}: a window must "
                                 "be >= 1 or None")
            if self.scan_layers and len(set(self.layer_windows)) > 1:
                raise ValueError(f"LlamaConfig: scan_layers=True needs one window for every "
                                 f"layer (one scanned block), got layer_windows="
                                 f"{self.layer_windows}")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    def window(self, layer: int) -> int | None:
        """Sliding window of ``layer`` (None = full attention)."""
        return None if self.layer_windows is None else self.layer_windows[layer]


# ----------------------------------------------------------------------------------------------
# Layers


def _linear(rngs: nnx.Rngs, din: int, dout: int, cfg: LlamaConfig, bias: bool = False,
            std: float | None = None) -> nnx.Linear:
    return nnx.Linear(din, dout, use_bias=bias,
                      kernel_init=nnx.initializers.normal(std or 1.0 / math.sqrt(din)),
                      dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)


def window_mask(positions: jax.Array, window: int | None) -> jax.Array | None:
    """bool [B, L, L]: query i may see key j iff ``pos_i - pos_j < window`` (None: no window)."""
    if window is None:
        return None
    return (positions[:, :, None] - positions[:, None, :]) < window


class Attention(nnx.Module):
    """Grouped-query self-attention with the checkpoint's RoPE, optional biases and window."""

    def __init__(self, cfg: LlamaConfig, layer: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.window = cfg.window(layer)
        e, h, k, d = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.dim_per_head
        self.q_proj = _linear(rngs, e, h * d, cfg, cfg.qkv_bias)
        self.k_proj = _linear(rngs, e, k * d, cfg, cfg.qkv_bias)
        self.v_proj = _linear(rngs, e, k * d, cfg, cfg.qkv_bias)
        self.o_proj = _linear(rngs, h * d, e, cfg, cfg.out_bias,
                              std=1.0 / math.sqrt(h * d * 2 * cfg.num_layers))

    def qkv(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x [B, L, E], positions [B, L] -> q [B, H, L, D] (RoPE'd, times YaRN's m^2),
        k [B, K, L, D] (RoPE'd), v [B, K, L, D]."""
        cfg = self.cfg
        b, l, _ = x.shape
        q = self.q_proj(x).reshape(b, l, cfg.num_heads, cfg.dim_per_head)
        k = self.k_proj(x).reshape(b, l, cfg.kv_heads, cfg.dim_per_head)
        v = self.v_proj(x).reshape(b, l, cfg.kv_heads, cfg.dim_per_head)
        q = apply_rope(q, positions, cfg.rope)
        k = apply_rope(k, positions, cfg.rope)
        m = cfg.rope.attention_scale
        if m != 1.0:
            q = (q.astype(jnp.float32) * (m * m)).astype(q.dtype)
        return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
        """Full-sequence attention. x [B, L, E]; positions [B, L]; mask bool [B or 1, L, L]
        (True = may attend; this layer's window is applied on top). Returns [B, L, E]."""
        q, k, v = self.qkv(x, positions)
        wm = window_mask(positions, self.window)
        if wm is not None:
            mask = mask & wm
        out = attention_math.grouped_attention(q, k, v, mask[:, None, None, :, :])
        b, _, l, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, l, -1))

    def decode(self, x: jax.Array, positions: jax.Array, layer_cache: Any,
               backend: cache_backend.KVCacheBackend) -> tuple[jax.Array, Any]:
        """Appends the new keys/values and attends over the cache (protocol of
        :mod:`models.kv_cache`). x [B, T, E]; positions int32 [B, T] contiguous.

        Raises:
          ValueError: a windowed layer whose dense cache is longer than the window, with a
            backend other than the dense one.
        """
        q, k, v = self.qkv(x, positions)
        start = positions[:, 0]
        layer_cache = backend.update(layer_cache, k, v, start)
        if self.window is not None and isinstance(backend, cache_backend.DenseKVCache) and \
                layer_cache["k"].shape[2] > self.window:
            s = layer_cache["k"].shape[2]
            mask = attention_math.causal_cache_mask(start, q.shape[2], s)
            pos = positions[:, :, None] - jnp.arange(s)[None, None, :]  # [B, T, S]
            mask = mask & (pos < self.window)[:, None, None]
            out = attention_math.grouped_attention(q, layer_cache["k"], layer_cache["v"], mask)
        else:
            out = backend.attend(layer_cache, q, start)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1)), layer_cache


def _norm(cfg: LlamaConfig, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, dtype=cfg.dtype,
                       param_dtype=cfg.param_dtype, rngs=rngs)


class Block(nnx.Module):
    """Pre-norm decoder block."""

    def __init__(self, cfg: LlamaConfig, layer: int, *, rngs: nnx.Rngs):
        self.norm1 = _norm(cfg, rngs)
        self.attn = Attention(cfg, layer, rngs=rngs)
        self.norm2 = _norm(cfg, rngs)
        self.mlp = SwiGLU(cfg.d_model, cfg.mlp_dim, num_layers=cfg.num_layers, dtype=cfg.dtype,
                          param_dtype=cfg.param_dtype, rngs=rngs)

    def __call__(self, x, positions, mask):
        x = x + self.attn(self.norm1(x), positions, mask)
        return x + self.mlp(self.norm2(x))

    def decode(self, x, positions, layer_cache, backend):
        a, layer_cache = self.attn.decode(self.norm1(x), positions, layer_cache, backend)
        x = x + a
        return x + self.mlp(self.norm2(x)), layer_cache


class Llama(nnx.Module):
    """The decoder. See the module docstring for the architecture and dimensions."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.dtype,
                               param_dtype=cfg.param_dtype,
                               embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        if cfg.scan_layers:
            # One Block whose parameters carry a leading layer axis (every layer has layer 0's
            # window, which the config checks is every layer's).
            @nnx.vmap(in_axes=0, out_axes=0)
            def stacked_blocks(layer_rngs):
                return Block(cfg, 0, rngs=layer_rngs)

            self.blocks = stacked_blocks(rngs.split(cfg.num_layers))
        else:
            self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.num_layers)])
        self.final_norm = _norm(cfg, rngs)
        self.head = None if cfg.tie_embeddings else _linear(rngs, cfg.d_model, cfg.vocab_size, cfg)

    def _check_tokens(self, tokens: jax.Array, where: str) -> None:
        checks.array(tokens, "tokens", where, ndim=2, kind="int", nonempty=True)
        if not checks.is_traced(tokens):
            ids = np.asarray(tokens)
            if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
                raise checks.error(where, "tokens", f"ids in [0, {self.cfg.vocab_size})",
                                   f"min {ids.min()}, max {ids.max()}")
        if tokens.shape[1] > self.cfg.max_len:
            raise ValueError(f"{where}: sequence length {tokens.shape[1]} exceeds the model's "
                             f"max_len={self.cfg.max_len}")

    def head_logits(self, x: jax.Array) -> jax.Array:
        """Logits float32 [..., V] from final hidden states x [..., E] (final norm, then the
        tied embedding or the output head)."""
        x = self.final_norm(x)
        logits = self.embed.attend(x) if self.head is None else self.head(x)
        return logits.astype(jnp.float32)

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 mask: jax.Array | None = None) -> jax.Array:
        """Logits for every position (causal; each layer's sliding window applied).

        Args:
          tokens: int [B, L], L <= max_len.
          positions: int [B, L] RoPE positions; defaults to 0..L-1.
          mask: bool [B or 1, L, L] (True = may attend), default causal.

        Returns:
          float32 logits [B, L, V].

        Raises:
          ValueError: ``tokens`` not a non-empty int [B, L] (or, when concrete, ids outside
            [0, V)), L > max_len, ``positions`` not int [B, L], ``mask`` not bool [B or 1, L, L].
        """
        self._check_tokens(tokens, "Llama.__call__")
        b, l = tokens.shape
        if positions is not None:
            checks.array(positions, "positions", "Llama.__call__", kind="int", shape=(b, l))
        if mask is not None:
            checks.array(mask, "mask", "Llama.__call__", kind="bool", ndim=3)
            if mask.shape[0] not in (1, b) or mask.shape[1:] != (l, l):
                raise checks.error("Llama.__call__", "mask", f"of shape [{b} or 1, {l}, {l}]",
                                   f"shape {tuple(mask.shape)}")
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
        if mask is None:
            mask = jnp.tril(jnp.ones((l, l), bool))[None]
        x = self.embed(tokens)
        if self.cfg.scan_layers:
            return self.head_logits(scan_blocks(self.blocks, x,
                                                lambda block, h: block(h, positions, mask)))
        for block in self.blocks:
            x = block(x, positions, mask)
        return self.head_logits(x)

    def check_backend(self, backend: cache_backend.KVCacheBackend, cache_len: int) -> None:
        """Raises ValueError if ``backend`` cannot serve this model with ``cache_len`` slots: a
        sliding window shorter than the cache with a backend other than the dense one."""
        windows = [w for w in (self.cfg.layer_windows or ()) if w is not None and w < cache_len]
        if windows and not isinstance(backend, cache_backend.DenseKVCache):
            raise ValueError(
                f"KV-cache backend {type(backend).__name__} cannot honour the model's sliding "
                f"window of {min(windows)} tokens with a cache of {cache_len} slots (it would "
                "attend to tokens outside the window); use the dense backend or a cache no "
                "longer than the window")

    def init_cache(self, batch_size: int, max_len: int | None = None,
                   backend: cache_backend.KVCacheBackend | None = None) -> list[Any]:
        """An empty cache: one backend-specific pytree per layer (a list), or with ``scan_layers``
        one pytree whose leaves lead with the layer axis [N, ...].

        Raises:
          ValueError: ``batch_size`` not an int >= 1, ``max_len`` not None or an int in
            1..the model's, or the backend cannot honour a sliding window (:meth:`check_backend`).
        """
        checks.integer(batch_size, "batch_size", "Llama.init_cache", minimum=1)
        checks.integer(max_len, "max_len", "Llama.init_cache", minimum=1, allow_none=True)
        backend = backend or cache_backend.DenseKVCache()
        max_len = max_len or self.cfg.max_len
        if max_len > self.cfg.max_len:
            raise ValueError(f"cache length {max_len} exceeds the model's max_len={self.cfg.max_len}")
        self.check_backend(backend, max_len)
        if self.cfg.scan_layers:
            return init_stacked_cache(backend, self.cfg.num_layers, batch_size, max_len,
                                      self.cfg.kv_heads, self.cfg.dim_per_head, self.cfg.dtype)
        return [backend.init(batch_size, max_len, self.cfg.kv_heads, self.cfg.dim_per_head,
                             self.cfg.dtype) for _ in range(self.cfg.num_layers)]

    def decode(self, tokens: jax.Array, cache: Any, start: jax.Array,
               backend: cache_backend.KVCacheBackend | None = None) -> tuple[jax.Array, list[Any]]:
        """Appends ``tokens`` at positions ``start .. start + T - 1`` and returns their logits.

        Prefill is ``decode`` of the prompt with ``start = 0``; generation then decodes one token
        at a time (see :func:`models.sampling.generate`).

        Args:
          tokens: int [B, T].
          cache: from :meth:`init_cache` with the same backend (a list of layer caches, or with
            ``scan_layers`` the stacked cache).
          start: int32 [B], tokens already in each row's cache.
          backend: the KV-cache backend (default dense).

        Returns:
          (float32 logits [B, T, V], the updated cache).

        Raises:
          ValueError: as :meth:`__call__`; a cache with the wrong number of layers (or, with
            ``scan_layers``, a list, or leaves without the leading layer axis); ``start`` not
            an int scalar or [B]; a concrete ``start`` that leaves no room for T tokens in the
            cache (raised by the backend's ``update``).
        """
        backend = backend or cache_backend.DenseKVCache()
        self._check_tokens(tokens, "Llama.decode")
        if not self.cfg.scan_layers and len(cache) != self.cfg.num_layers:
            raise ValueError(f"Llama.decode: cache has {len(cache)} layers, the model "
                             f"{self.cfg.num_layers}")
        b, t = tokens.shape
        if not hasattr(start, "shape"):
            start = np.asarray(start)
        checks.array(start, "start", "Llama.decode", kind="int")
        if tuple(start.shape) not in ((), (b,)):
            raise checks.error("Llama.decode", "start", f"an int scalar or of shape [{b}]",
                               f"shape {tuple(start.shape)}")
        start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (b,))
        positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        x = self.embed(tokens)
        if self.cfg.scan_layers:
            x, cache = scan_blocks_decode(
                self.blocks, x, cache, self.cfg.num_layers, "Llama.decode: cache",
                lambda block, h, layer_cache: block.decode(h, positions, layer_cache, backend))
            return self.head_logits(x), cache
        new_cache = []
        for block, layer_cache in zip(self.blocks, cache, strict=True):
            x, layer_cache = block.decode(x, positions, layer_cache, backend)
            new_cache.append(layer_cache)
        return self.head_logits(x), new_cache

    def flush_cache(self, cache: Any,
                    backend: cache_backend.KVCacheBackend | None = None) -> list[Any]:
        """The backend's optional ``flush`` on every layer of ``cache``
        (:func:`kernels.cache_backend.flush_layers`): call it after each one-token
        :meth:`decode` step (QVG / KIVI quantize a complete chunk here, out of the decode step;
        other backends: the identity).

        Raises:
          ValueError: a cache that is not the backend's (from its ``flush``).
        """
        return cache_backend.flush_layers(backend or cache_backend.DenseKVCache(), cache)


def backend_for(name: str, cfg: LlamaConfig, **kwargs) -> cache_backend.KVCacheBackend:
    """:func:`models.kv_cache.get_backend` with the model's RoPE passed to the backends that
    re-apply it to stored keys (those with a ``rope_base`` field, QVG: ``rope_base=cfg.rope``,
    scaling included) unless ``kwargs`` sets it.

    Raises:
      ValueError: as ``get_backend``.
    """
    cls = cache_backend.registered_backends().get(name)
    if cls is not None and "rope_base" in {f.name for f in dataclasses.fields(cls)}:
        kwargs.setdefault("rope_base", cfg.rope)
    return kvc.get_backend(name, **kwargs)


def scanned(cfg: LlamaConfig, params: nnx.State) -> tuple[LlamaConfig, nnx.GraphDef, nnx.State]:
    """A model's unrolled parameters in the scanned layout (``scan_layers=True``): the same
    function, one compiled block instead of N.

    Args:
      cfg: the unrolled model's config (``scan_layers=False``).
      params: its ``nnx.State`` (e.g. from :mod:`models.checkpoints`); block leaves per layer.

    Returns:
      (the config with ``scan_layers=True``, its graphdef, the parameters with every block leaf
      stacked [N, ...], :func:`models.transformer.stack_layer_params`). ``nnx.merge`` the last two.

    Raises:
      ValueError: ``cfg`` already scanned, layers of different windows, or ``params`` not a Llama
        state in the unrolled layout.
    """
    return transformer_scanned(cfg, params, Llama)
