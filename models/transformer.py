"""A decoder-only (or bidirectional) transformer in Flax NNX, used functionally.

Dimensions: B batch, L sequence (query) length, S cache length (key slots), H query heads,
K key/value heads (GQA: H = G * K), G queries per kv head, D head dim, E model width (d_model),
F MLP hidden width, V vocabulary, C conditioning width.

Architecture: token embedding; pre-norm blocks (RMSNorm -> grouped-query attention with rotary
position embeddings (RoPE, Su et al. 2021) -> residual; RMSNorm -> SwiGLU MLP -> residual); a final
RMSNorm and an untied output head. With ``time_conditioning`` every block is modulated by
adaLN-zero (Peebles & Xie 2023, "Scalable Diffusion Models with Transformers", Sec. 3.2): a
conditioning vector c (a sinusoidal embedding of a per-example scalar, e.g. the diffusion time)
gives shift, scale and gate for each sub-layer through a zero-initialised linear map, so every
block is the identity at initialisation.

Use it functionally (Flax NNX's functional API): ``graphdef, params = nnx.split(Transformer(cfg, rngs=...))`` once,
then inside jitted functions ``model = nnx.merge(graphdef, params)``.

Decoding goes through a KV-cache backend (see :mod:`models.kv_cache`): :meth:`Transformer.decode`
appends new keys/values to each layer's cache and computes attention of the new queries over it with
``backend.attend``. The dense backend is the reference; the sparse-decode (FFD, Quest) and
quantized (QVG, KIVI) kernels implement the same protocol.

Layer layout: by default the N blocks are separate modules applied in a Python loop (N copies of
the block in the compiled program). With ``TransformerConfig.scan_layers`` the blocks' parameters
are stacked along a leading layer axis [N, ...] and applied with one ``jax.lax.scan`` (one copy);
the KV cache is then stacked the same way. :func:`stack_layer_params` /
:func:`unstack_layer_params` convert parameters between the two layouts, and
:func:`stack_layer_caches` / :func:`unstack_layer_caches` caches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core import sharding as shd
from kernels import cache_backend, checks
from kernels.rope import apply_rope
from models import attention as attn_lib

# Rematerialisation policies for ``TransformerConfig.remat`` (None: no remat).
REMAT_POLICIES: dict[str, Any] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
}

# Compute dtypes, by name, that a run config may give ``TransformerConfig.dtype`` (as
# ``jnp.dtype(name)``; parameters stay float32).
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")

# Logical axes of every parameter, keyed by the end of its path (module, parameter), read by
# core.sharding.param_shardings: the model width ("embed") is FSDP-sharded over `data`; heads, kv
# heads, MLP width and vocabulary are tensor-parallel over `model`. Stacked layers (scan_layers) gain
# a leading "layers" axis.
PARAM_AXES: dict[tuple[str, ...], tuple[str | None, ...]] = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("q_proj", "kernel"): ("embed", "heads"),
    ("k_proj", "kernel"): ("embed", "kv_heads"),
    ("v_proj", "kernel"): ("embed", "kv_heads"),
    ("o_proj", "kernel"): ("heads", "embed"),
    ("gate", "kernel"): ("embed", "mlp"),
    ("up", "kernel"): ("embed", "mlp"),
    ("down", "kernel"): ("mlp", "embed"),
    ("norm1", "scale"): ("norm",),
    ("norm2", "scale"): ("norm",),
    ("final_norm", "scale"): ("norm",),
    ("head", "kernel"): ("embed", "vocab"),
    ("ada", "kernel"): ("cond", "embed"),
    ("ada", "bias"): ("embed",),
    ("final_ada", "kernel"): ("cond", "embed"),
    ("final_ada", "bias"): ("embed",),
    ("time_in", "kernel"): ("cond", None),
    ("time_out", "kernel"): ("cond", None),
}


def _residual(x: jax.Array) -> jax.Array:
    """The residual stream [B, L, E], under a mesh in context, pinned to the batch on ``data`` and
    the width whole (:func:`core.sharding.constrain`). Left free, XLA partitions a matmul with
    FSDP-sharded weights along its contracting width and all-reduces full-batch [B, L, F] outputs
    (seen in the compiled ``lm`` step at d_model 2048 on v5e:4x4)."""
    return shd.constrain(x, ("batch", "seq", "embed"))


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Static hyper-parameters (hashable, safe as a jit static argument).

    Attributes:
      vocab_size: V.
      max_len: the longest sequence (and KV cache) the model accepts.
      d_model: E.
      num_layers: number of blocks.
      num_heads: H.
      num_kv_heads: K (GQA); must divide H. Defaults to H (multi-head attention).
      head_dim: D; defaults to E // H.
      mlp_dim: F (SwiGLU hidden width); defaults to 4 * E rounded to a multiple of 8 after x2/3.
      causal: causal mask in :meth:`__call__` (False gives a bidirectional encoder, e.g. MDLM).
      time_conditioning: adaLN-zero modulation by a per-example scalar (diffusion time).
      cond_dim: C, width of the conditioning vector; defaults to E.
      rope_base: RoPE base frequency.
      norm_eps: RMSNorm epsilon.
      dtype: computation dtype (parameters are float32).
      attention: full-sequence attention implementation (:mod:`models.attention`): ``"reference"``
        (float32 L x L scores in memory; the CPU default), ``"blockwise"`` (exact, O(L) memory per
        query block, any mask, every platform), ``"cudnn"`` (cuDNN flash attention on GPU; causal
        and bidirectional masks), ``"splash"`` (JAX's Pallas TPU splash kernels; causal and
        bidirectional masks, custom masks run blockwise) or ``"auto"`` (the platform's fused
        kernel, chosen when the program is lowered: splash on TPU, cuDNN on GPU, blockwise
        elsewhere). Decoding through a KV-cache backend is unaffected.
      attention_block: keys per block of the blockwise attention.
      remat: rematerialisation of each block in the backward pass (:data:`REMAT_POLICIES`):
        ``"none"``, ``"full"`` (save only the block inputs), ``"minimal"`` (also save matmul outputs
        without batch dimensions), ``"dots"`` (save every matmul output).
      scan_layers: store the blocks' parameters stacked along a leading layer axis [num_layers, ...]
        and apply them with one ``scan`` (the compiled program holds one block instead of
        num_layers); the KV cache of :meth:`Transformer.init_cache` is then stacked the same way.
        Same function and same parameter count; convert parameters between the layouts with
        :func:`stack_layer_params` / :func:`unstack_layer_params`. On XLA:CPU, float8 cache
        writes inside the loop are slow (the FFD cache's decode step ran ~5x slower scanned).
    """

    vocab_size: int
    max_len: int
    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    head_dim: int | None = None
    mlp_dim: int | None = None
    causal: bool = True
    time_conditioning: bool = False
    cond_dim: int | None = None
    rope_base: float = 10_000.0
    norm_eps: float = 1e-6
    dtype: Any = jnp.float32
    attention: str = "reference"
    attention_block: int = 512
    remat: str = "none"
    scan_layers: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "max_len", "d_model", "num_layers", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"TransformerConfig.{name}={getattr(self, name)}: must be >= 1")
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"TransformerConfig: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.kv_heads} (grouped-query attention needs H = G * K)"
            )
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"TransformerConfig: d_model={self.d_model} not divisible by "
                f"num_heads={self.num_heads}; set head_dim explicitly"
            )
        if self.dim_per_head % 2:
            raise ValueError(f"TransformerConfig: head_dim={self.dim_per_head} must be even (RoPE)")
        attn_lib.check_implementation(self.attention)
        if self.attention_block < 1:
            raise ValueError(f"TransformerConfig: attention_block={self.attention_block} must be >= 1")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"TransformerConfig: remat={self.remat!r} is not one of "
                             f"{tuple(REMAT_POLICIES)}")

    @property
    def logical_sizes(self) -> dict[str, int]:
        """Counts of the fused logical axes of :data:`PARAM_AXES` (q/k/v kernels are [E, H * D] and
        [E, K * D]): pass to ``core.sharding.param_shardings`` so that no split cuts a head."""
        return {"heads": self.num_heads, "kv_heads": self.kv_heads}

    def check_model_parallelism(self, model_parallelism: int) -> None:
        """Raises ValueError unless ``model_parallelism`` (the mesh's ``model`` axis) divides the
        query heads and the MLP width, which tensor parallelism splits (kv heads that it does not
        divide are replicated, as usual for GQA)."""
        for name, size in (("num_heads", self.num_heads), ("mlp width", self.hidden_dim)):
            if size % model_parallelism:
                raise ValueError(f"model_parallelism={model_parallelism} does not divide the model's "
                                 f"{name} ({size}); tensor parallelism splits it over the model axis")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    @property
    def hidden_dim(self) -> int:
        if self.mlp_dim:
            return self.mlp_dim
        return 8 * ((int(4 * self.d_model * 2 / 3) + 7) // 8)

    @property
    def cond_width(self) -> int:
        return self.cond_dim or self.d_model


# ----------------------------------------------------------------------------------------------
# FLOPs


def forward_flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Analytic forward FLOPs per token for a sequence of ``seq_len`` tokens (multiply-add = 2).

    Counts every matrix multiply: Q/K/V/O projections, QK^T and AV over the full ``seq_len`` keys
    (the dense computation, as executed; a causal mask does not halve it), the SwiGLU MLP, the output
    head, and with time conditioning the adaLN maps (once per sequence, so divided by ``seq_len``).
    Embedding lookups, norms, RoPE and softmax are not counted (O(E) per token). The training
    compute of the scaling-law literature is ``C = 3 * F_fwd * tokens`` (Kaplan et al. 2020).

    Returns:
      FLOPs per token (float).
    """
    e, h, k, d, f, v = (cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.dim_per_head,
                        cfg.hidden_dim, cfg.vocab_size)
    proj = 2 * e * (h * d + 2 * k * d) + 2 * h * d * e
    attn = 2 * 2 * seq_len * h * d
    mlp = 2 * 3 * e * f
    per_layer = proj + attn + mlp
    total = cfg.num_layers * per_layer + 2 * e * v
    if cfg.time_conditioning:
        c = cfg.cond_width
        adaln = cfg.num_layers * 2 * c * 6 * e + 2 * c * 2 * e
        time_mlp = 2 * (c * c + c * c)  # frequency features (width C) -> C -> C
        total += (adaln + time_mlp) / seq_len
    return float(total)


def param_count(params) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(x.size for x in jax.tree.leaves(params)))


# ----------------------------------------------------------------------------------------------
# Layers


def _dense(rngs: nnx.Rngs, din: int, dout: int, cfg: TransformerConfig, *, zero: bool = False,
           std: float | None = None) -> nnx.Linear:
    init = (nnx.initializers.zeros_init() if zero
            else nnx.initializers.normal(std if std is not None else 1.0 / math.sqrt(din)))
    return nnx.Linear(din, dout, use_bias=zero, kernel_init=init, dtype=cfg.dtype,
                      param_dtype=jnp.float32, rngs=rngs)


def _modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    # x [B, L, E]; shift, scale [B, E]
    return x * (1.0 + scale[:, None, :]) + shift[:, None, :]


def timestep_embedding(t: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
    """Sinusoidal features of a per-example scalar: t [B] float -> [B, dim].

    ``t`` is scaled by 1000 first so that t in [0, 1] (diffusion time) spans the frequency range,
    as in DDPM-style time embeddings.
    """
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = 1000.0 * t.astype(jnp.float32)[:, None] * freqs[None, :]
    emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
    if dim % 2:
        emb = jnp.pad(emb, ((0, 0), (0, 1)))
    return emb


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        e, h, k, d = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.dim_per_head
        self.q_proj = _dense(rngs, e, h * d, cfg)
        self.k_proj = _dense(rngs, e, k * d, cfg)
        self.v_proj = _dense(rngs, e, k * d, cfg)
        self.o_proj = _dense(rngs, h * d, e, cfg, std=1.0 / math.sqrt(h * d * 2 * cfg.num_layers))

    def qkv(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x [B, L, E], positions [B, L] -> q [B, H, L, D], k, v [B, K, L, D] (RoPE on q, k)."""
        cfg = self.cfg
        b, l, _ = x.shape
        q = self.q_proj(x).reshape(b, l, cfg.num_heads, cfg.dim_per_head)
        k = self.k_proj(x).reshape(b, l, cfg.kv_heads, cfg.dim_per_head)
        v = self.v_proj(x).reshape(b, l, cfg.kv_heads, cfg.dim_per_head)
        q = apply_rope(q, positions, cfg.rope_base)
        k = apply_rope(k, positions, cfg.rope_base)
        return (q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None) -> jax.Array:
        """Full-sequence attention. x [B, L, E]; positions [B, L] int; mask [B or 1, L, L] bool
        (True = query may attend to key), or None for the config's causal / bidirectional mask.
        Returns [B, L, E]."""
        q, k, v = self.qkv(x, positions)
        kind = "custom" if mask is not None else ("causal" if self.cfg.causal else "full")
        out = attn_lib.attention(q, k, v, implementation=self.cfg.attention, mask_kind=kind,
                                 mask=mask, block_size=self.cfg.attention_block)
        b, _, l, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, l, -1))

    def decode(self, x: jax.Array, positions: jax.Array, layer_cache: Any,
               backend: cache_backend.KVCacheBackend) -> tuple[jax.Array, Any]:
        """Incremental attention: appends the new keys/values and attends over the cache.

        x [B, T, E]; positions [B, T] int32 (absolute positions of the new tokens, contiguous).
        Returns ([B, T, E], updated layer cache).
        """
        q, k, v = self.qkv(x, positions)
        start = positions[:, 0]
        layer_cache = backend.update(layer_cache, k, v, start)
        out = backend.attend(layer_cache, q, start)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1)), layer_cache


class SwiGLU(nnx.Module):
    """SwiGLU feed-forward (Shazeer 2020, eq. 6 without biases): ``down(silu(gate(x)) * up(x))``.

    x [..., E] -> [..., E] through a hidden width F. ``gate`` and ``up`` are initialised
    N(0, 1/E), ``down`` N(0, 1/(2 N F)) for N layers (a residual branch scaled down with depth, as
    GPT-2 does). Shared by :class:`Transformer` and :class:`models.llama.Llama`.
    """

    def __init__(self, d_model: int, hidden: int, *, num_layers: int, dtype, param_dtype,
                 rngs: nnx.Rngs):
        def linear(din: int, dout: int, std: float) -> nnx.Linear:
            return nnx.Linear(din, dout, use_bias=False, kernel_init=nnx.initializers.normal(std),
                              dtype=dtype, param_dtype=param_dtype, rngs=rngs)

        self.gate = linear(d_model, hidden, 1.0 / math.sqrt(d_model))
        self.up = linear(d_model, hidden, 1.0 / math.sqrt(d_model))
        self.down = linear(hidden, d_model, 1.0 / math.sqrt(hidden * 2 * num_layers))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """Pre-norm transformer block, optionally adaLN-zero modulated."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.norm1 = nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, dtype=cfg.dtype, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.norm2 = nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, dtype=cfg.dtype, rngs=rngs)
        self.mlp = SwiGLU(cfg.d_model, cfg.hidden_dim, num_layers=cfg.num_layers, dtype=cfg.dtype,
                          param_dtype=jnp.float32, rngs=rngs)
        self.ada = (_dense(rngs, cfg.cond_width, 6 * cfg.d_model, cfg, zero=True)
                    if cfg.time_conditioning else None)

    def _mods(self, c: jax.Array | None):
        if self.ada is None:
            return None
        if c is None:
            raise ValueError("this model is time-conditioned: pass cond (a per-example scalar [B])")
        return jnp.split(self.ada(jax.nn.silu(c)), 6, axis=-1)

    def __call__(self, x, positions, mask, c=None):
        mods = self._mods(c)
        if mods is None:
            x = x + self.attn(self.norm1(x), positions, mask)
            return x + self.mlp(self.norm2(x))
        sh1, sc1, g1, sh2, sc2, g2 = mods
        x = x + g1[:, None, :] * self.attn(_modulate(self.norm1(x), sh1, sc1), positions, mask)
        return x + g2[:, None, :] * self.mlp(_modulate(self.norm2(x), sh2, sc2))

    def decode(self, x, positions, layer_cache, backend, c=None):
        mods = self._mods(c)
        if mods is None:
            a, layer_cache = self.attn.decode(self.norm1(x), positions, layer_cache, backend)
            x = x + a
            return x + self.mlp(self.norm2(x)), layer_cache
        sh1, sc1, g1, sh2, sc2, g2 = mods
        a, layer_cache = self.attn.decode(_modulate(self.norm1(x), sh1, sc1), positions,
                                          layer_cache, backend)
        x = x + g1[:, None, :] * a
        return x + g2[:, None, :] * self.mlp(_modulate(self.norm2(x), sh2, sc2)), layer_cache


class Transformer(nnx.Module):
    """The language model. See the module docstring for the architecture and dimensions."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.dtype,
                               embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        if cfg.scan_layers:
            # One Block whose parameters carry a leading layer axis, each layer from its own key.
            @nnx.vmap(in_axes=0, out_axes=0)
            def stacked_blocks(layer_rngs):
                return Block(cfg, rngs=layer_rngs)

            self.blocks = stacked_blocks(rngs.split(cfg.num_layers))
        else:
            self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = nnx.RMSNorm(cfg.d_model, epsilon=cfg.norm_eps, dtype=cfg.dtype,
                                      rngs=rngs)
        self.head = _dense(rngs, cfg.d_model, cfg.vocab_size, cfg,
                           std=1.0 / math.sqrt(cfg.d_model))
        if cfg.time_conditioning:
            c = cfg.cond_width
            self.time_in = _dense(rngs, c, c, cfg)
            self.time_out = _dense(rngs, c, c, cfg)
            self.final_ada = _dense(rngs, c, 2 * cfg.d_model, cfg, zero=True)

    # -- helpers --------------------------------------------------------------------------------

    def _check_tokens(self, tokens: jax.Array, where: str) -> None:
        checks.array(tokens, "tokens", where, ndim=2, kind="int")
        if tokens.shape[1] > self.cfg.max_len:
            raise ValueError(
                f"{where}: sequence length {tokens.shape[1]} exceeds the model's "
                f"max_len={self.cfg.max_len}"
            )

    def condition(self, cond: jax.Array | None) -> jax.Array | None:
        """Conditioning vector c [B, C] from a per-example scalar cond [B] (None if unconditioned).

        Raises:
          ValueError: the model is time-conditioned and ``cond`` is None, or the reverse.
        """
        if not self.cfg.time_conditioning:
            if cond is not None:
                raise ValueError("cond was given but the model has time_conditioning=False")
            return None
        if cond is None:
            raise ValueError("this model is time-conditioned: pass cond (a per-example scalar [B])")
        feats = timestep_embedding(jnp.atleast_1d(cond), self.cfg.cond_width)
        return self.time_out(jax.nn.silu(self.time_in(feats)))

    def head_logits(self, x: jax.Array, c: jax.Array | None = None) -> jax.Array:
        """Logits float32 [..., V] from final hidden states x [..., E] (final norm, AdaLN
        modulation by the condition c when time-conditioned, output head)."""
        x = self.final_norm(x)
        if c is not None:
            shift, scale = jnp.split(self.final_ada(jax.nn.silu(c)), 2, axis=-1)
            x = _modulate(x, shift, scale)
        return self.head(x).astype(jnp.float32)

    # -- full forward ---------------------------------------------------------------------------

    def __call__(self, tokens: jax.Array, cond: jax.Array | None = None, *,
                 positions: jax.Array | None = None, mask: jax.Array | None = None,
                 return_hidden: bool = False) -> jax.Array:
        """Logits for every position.

        Args:
          tokens: int [B, L], L <= max_len.
          cond: float [B] per-example scalar (diffusion time / noise level); required iff
            ``time_conditioning``.
          positions: int [B, L] RoPE positions; defaults to 0..L-1.
          mask: bool [B or 1, L, L] attention mask (True = may attend) overriding the config's
            causal / bidirectional default (e.g. Eso-LM's permuted causal order); None for the
            default, which the fused implementations compute without a mask array.
          return_hidden: return the final hidden states [B, L, E] (before the final norm) instead.

        Returns:
          float32 logits [B, L, V].

        Raises:
          ValueError: wrong rank, L > max_len, or ``cond`` inconsistent with the config.
        """
        self._check_tokens(tokens, "Transformer.__call__")
        b, l = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
        c = self.condition(cond)
        x = _residual(self.embed(tokens))
        policy = REMAT_POLICIES[self.cfg.remat]
        if self.cfg.scan_layers:
            x = scan_blocks(self.blocks, x, lambda block, h: _residual(block(h, positions, mask, c)),
                            remat=self.cfg.remat != "none", policy=policy)
        else:
            def apply(block, h):
                return _residual(block(h, positions, mask, c))

            if self.cfg.remat != "none":
                apply = nnx.remat(apply, policy=policy)
            for block in self.blocks:
                x = apply(block, x)
        if return_hidden:
            return x
        return self.head_logits(x, c)

    # -- KV-cache decoding ----------------------------------------------------------------------

    def init_cache(self, batch_size: int, max_len: int | None = None,
                   backend: cache_backend.KVCacheBackend | None = None) -> Any:
        """An empty cache: one backend-specific pytree per layer.

        Returns:
          a list of ``num_layers`` layer caches; with ``scan_layers``, one layer cache pytree whose
          leaves carry a leading layer axis [num_layers, ...] (:func:`stack_layer_caches` of that
          list).

        Raises:
          ValueError: ``max_len`` exceeds the model's ``max_len``; with ``scan_layers``, the
            backend's layer cache has a leaf that is not an array (it cannot be stacked).
        """
        backend = backend or cache_backend.DenseKVCache()
        max_len = max_len or self.cfg.max_len
        if max_len > self.cfg.max_len:
            raise ValueError(f"cache length {max_len} exceeds the model's max_len={self.cfg.max_len}")
        if self.cfg.scan_layers:
            return init_stacked_cache(backend, self.cfg.num_layers, batch_size, max_len,
                                      self.cfg.kv_heads, self.cfg.dim_per_head, self.cfg.dtype)
        return [backend.init(batch_size, max_len, self.cfg.kv_heads, self.cfg.dim_per_head,
                             self.cfg.dtype) for _ in range(self.cfg.num_layers)]

    def decode(self, tokens: jax.Array, cache: Any, start: jax.Array,
               backend: cache_backend.KVCacheBackend | None = None, cond: jax.Array | None = None
               ) -> tuple[jax.Array, Any]:
        """Appends ``tokens`` at positions ``start .. start + T - 1`` and returns their logits.

        Prefill is ``decode`` of the whole prompt with ``start = 0``; generation then decodes one
        token at a time. Attention is causal over the cache (a new token sees every earlier slot and
        the new tokens up to itself).

        Args:
          tokens: int [B, T].
          cache: from :meth:`init_cache` (same backend): a list of layer caches, or with
            ``scan_layers`` the stacked layer cache (leaves [num_layers, ...]).
          start: int32 [B], number of tokens already in each row's cache (ragged rows allowed).
          backend: the KV-cache backend (default dense).
          cond: as in :meth:`__call__`.

        Returns:
          (float32 logits [B, T, V], the updated cache, in the layout it was given).

        Raises:
          ValueError: as :meth:`__call__`; with ``scan_layers``, a cache that is a list or whose
            leaves do not lead with ``num_layers``.
        """
        backend = backend or cache_backend.DenseKVCache()
        self._check_tokens(tokens, "Transformer.decode")
        b, t = tokens.shape
        start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (b,))
        positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        c = self.condition(cond)
        x = self.embed(tokens)
        if self.cfg.scan_layers:
            x, cache = scan_blocks_decode(
                self.blocks, x, cache, self.cfg.num_layers, "Transformer.decode: cache",
                lambda block, h, layer_cache: block.decode(h, positions, layer_cache, backend, c))
            return self.head_logits(x, c), cache
        new_cache = []
        for block, layer_cache in zip(self.blocks, cache, strict=True):
            x, layer_cache = block.decode(x, positions, layer_cache, backend, c)
            new_cache.append(layer_cache)
        return self.head_logits(x, c), new_cache

    def flush_cache(self, cache: Any, backend: cache_backend.KVCacheBackend | None = None) -> Any:
        """The backend's optional ``flush`` on every layer of ``cache``
        (:func:`kernels.cache_backend.flush_layers`): call it after each one-token
        :meth:`decode` step (QVG / KIVI quantize a complete chunk here, out of the decode step;
        other backends: the identity).

        Args:
          cache: from :meth:`init_cache` / :meth:`decode` (a list, or with ``scan_layers`` the
            stacked cache); backend: the one it was made with (default dense).

        Returns:
          the cache, in the layout it was given.

        Raises:
          ValueError: a cache that is not the backend's (from its ``flush``).
        """
        return cache_backend.flush_layers(backend or cache_backend.DenseKVCache(), cache)


# ----------------------------------------------------------------------------------------------
# Applying stacked blocks (scan_layers), shared by the decoders of this package


def scan_blocks(blocks: nnx.Module, x: jax.Array, apply: Any, *, remat: bool = False,
                policy: Any = None) -> jax.Array:
    """``x`` through every layer of ``blocks`` (a module whose parameters carry a leading layer
    axis [N, ...], as ``scan_layers`` builds it) in one ``lax.scan``: the compiled program holds
    one block instead of N.

    Args:
      blocks: the stacked block module (``nnx.vmap`` of the block constructor).
      x: the residual stream entering layer 0, any shape ``apply`` accepts.
      apply: ``apply(block, h) -> h`` for one merged layer.
      remat: rematerialise each layer in the backward pass with ``policy`` (a
        ``jax.checkpoint_policies`` entry; None saves nothing but the layer inputs).

    Returns:
      the stream after layer N-1.
    """
    block_def, block_params = nnx.split(blocks)

    def layer(h, params):
        return apply(nnx.merge(block_def, params), h), None

    if remat:
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
    return jax.lax.scan(layer, x, block_params)[0]


def init_stacked_cache(backend: cache_backend.KVCacheBackend, num_layers: int, batch_size: int,
                       max_len: int, kv_heads: int, head_dim: int, dtype: Any) -> Any:
    """An empty cache of ``num_layers`` layers stacked along a leading axis (``scan_layers``):
    ``backend.init(batch_size, max_len, kv_heads, head_dim, dtype)`` with every leaf
    [num_layers, ...].

    Raises:
      ValueError: the backend's layer cache has a leaf that is not an array (it cannot be
        stacked).
    """
    layer = backend.init(batch_size, max_len, kv_heads, head_dim, dtype)
    for leaf in jax.tree.leaves(layer):
        if not isinstance(leaf, jax.Array | np.ndarray):
            raise ValueError(
                f"KV-cache backend {type(backend).__name__}: its layer cache has a leaf of "
                f"type {type(leaf).__name__}, which cannot be stacked along a layer axis "
                "(scan_layers=True); use scan_layers=False with this backend")
    return stack_layer_caches([layer] * num_layers)


def scan_blocks_decode(blocks: nnx.Module, x: jax.Array, cache: Any, num_layers: int, where: str,
                       decode: Any) -> tuple[jax.Array, Any]:
    """One decode step through stacked ``blocks`` in one ``lax.scan`` (see :func:`scan_blocks`).

    The stacked cache rides in the carry and layer i's slice is written back in place: passing it
    as scanned input/output instead copies the whole cache every step (2x slower greedy
    generation with the dense cache on CPU).

    Args:
      blocks: the stacked block module.
      x: the residual stream [B, T, E] entering layer 0.
      cache: the stacked layer cache (every leaf [N, ...], :func:`stack_layer_caches`).
      num_layers: N.
      where: names the cache in errors.
      decode: ``decode(block, h, layer_cache) -> (h, layer_cache)`` for one merged layer.

    Returns:
      (the stream after layer N-1, the updated stacked cache).

    Raises:
      ValueError: ``cache`` is a list, or a leaf does not lead with ``num_layers``.
    """
    _check_stacked(cache, num_layers, where)
    block_def, block_params = nnx.split(blocks)

    def layer(carry, xs):
        h, stacked = carry
        params, i = xs
        layer_cache = jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), stacked)
        h, layer_cache = decode(nnx.merge(block_def, params), h, layer_cache)
        stacked = jax.tree.map(
            lambda a, new: jax.lax.dynamic_update_index_in_dim(a, new, i, 0), stacked, layer_cache)
        return (h, stacked), None

    (x, cache), _ = jax.lax.scan(layer, (x, cache), (block_params, jnp.arange(num_layers)))
    return x, cache


# ----------------------------------------------------------------------------------------------
# Converting between the unrolled and the scanned (stacked) layouts


def _check_stacked(tree: Any, num_layers: int, where: str) -> None:
    if isinstance(tree, list | tuple):
        raise ValueError(f"{where} is a list of {len(tree)} per-layer entries, but the model has "
                         "scan_layers=True and expects them stacked along a leading layer axis "
                         "(see stack_layer_caches / stack_layer_params)")
    for leaf in jax.tree.leaves(tree):
        if not getattr(leaf, "shape", ()) or leaf.shape[0] != num_layers:
            raise ValueError(f"{where}: a leaf of shape {getattr(leaf, 'shape', None)} does not "
                             f"lead with the layer axis num_layers={num_layers}")


def stack_layer_caches(caches: list[Any]) -> Any:
    """Per-layer caches -> one cache pytree whose leaves gain a leading layer axis.

    Args:
      caches: a non-empty list of layer caches with one pytree structure (leaves [...]).

    Returns:
      the stacked cache (leaves [num_layers, ...]), as ``init_cache`` returns with ``scan_layers``.

    Raises:
      ValueError: an empty list, or layer caches whose pytree structures or leaf shapes differ.
    """
    if not caches:
        raise ValueError("stack_layer_caches: no layer caches given")
    structs = {jax.tree.structure(c) for c in caches}
    if len(structs) > 1:
        raise ValueError(f"stack_layer_caches: the layer caches have {len(structs)} different "
                         "pytree structures; only identical ones can be stacked")
    shapes = {tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(c)) for c in caches}
    if len(shapes) > 1:
        raise ValueError("stack_layer_caches: the layer caches' leaf shapes or dtypes differ")
    return jax.tree.map(lambda *xs: jnp.stack(xs), *caches)


def unstack_layer_caches(cache: Any) -> list[Any]:
    """Inverse of :func:`stack_layer_caches`: leaves [num_layers, ...] -> list of layer caches.

    Raises:
      ValueError: a leaf without a leading axis, or leaves whose leading axes differ.
    """
    leaves = jax.tree.leaves(cache)
    lead = {x.shape[0] if getattr(x, "shape", ()) else None for x in leaves}
    if not leaves or len(lead) != 1 or None in lead:
        raise ValueError("unstack_layer_caches: every leaf needs the same leading layer axis, got "
                         f"leading sizes {sorted(lead, key=str)}")
    n = lead.pop()
    return [jax.tree.map(lambda x, i=i: x[i], cache) for i in range(n)]


def scanned(cfg: Any, params: nnx.State, model_cls: type | None = None
            ) -> tuple[Any, nnx.GraphDef, nnx.State]:
    """A model's unrolled parameters in the scanned layout (``scan_layers=True``): the same
    function, one compiled block instead of N.

    Args:
      cfg: the unrolled model's config (``scan_layers=False``), a :class:`TransformerConfig` or
        any config ``model_cls`` is built from (:func:`models.llama.scanned` passes its Llama).
      params: its ``nnx.State``; block leaves per layer.
      model_cls: the decoder class (default :class:`Transformer`).

    Returns:
      (the config with ``scan_layers=True``, its graphdef, the parameters with every block leaf
      stacked [N, ...] by :func:`stack_layer_params`). ``nnx.merge`` the last two.

    Raises:
      ValueError: ``cfg`` already scanned; as the config's checks (e.g. a Llama's layers of
        different windows) or :func:`stack_layer_params`.
    """
    if cfg.scan_layers:
        raise ValueError(f"scanned: the {type(cfg).__name__} already has scan_layers=True")
    cfg = dataclasses.replace(cfg, scan_layers=True)
    cls = model_cls or Transformer
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
    return cfg, graphdef, stack_layer_params(params)


def stack_layer_params(params: nnx.State) -> nnx.State:
    """Parameters of an unrolled model -> those of the same model with ``scan_layers=True``.

    ``params['blocks']`` of an unrolled model holds one subtree per layer (keys 0 .. N-1); the
    result holds one subtree whose arrays are those of the layers stacked along a new leading
    axis [N, ...]; every other entry is passed through. ``nnx.merge`` it with the graphdef of a
    model built with ``scan_layers=True`` (and otherwise the same config). Works on any state with
    the model's structure (e.g. parameter-shaped optimizer moments).

    Args:
      params: ``nnx.split(model)[1]`` (or any ``nnx.State`` of that structure) of an unrolled model.

    Returns:
      an ``nnx.State`` in the scanned layout (same leaves, same dtypes, N times fewer block leaves).

    Raises:
      ValueError: not a Transformer state, no per-layer ``blocks`` entries (already stacked), layer
        indices that are not 0 .. N-1, or layers with different entries.
    """
    flat = _flat_state(params, "stack_layer_params")
    layers: dict[int, dict[tuple, Any]] = {}
    rest = []
    for path, var in flat:
        if path[0] == "blocks" and len(path) > 1 and isinstance(path[1], int):
            layers.setdefault(path[1], {})[path[2:]] = var
        else:
            rest.append((path, var))
    if not layers:
        raise ValueError("stack_layer_params: params['blocks'] has no per-layer entries (keys "
                         "0..N-1); already in the scanned layout?")
    n = len(layers)
    if sorted(layers) != list(range(n)):
        raise ValueError(f"stack_layer_params: layer indices {sorted(layers)} are not 0..{n - 1}")
    names = set(layers[0])
    for i in range(n):
        if set(layers[i]) != names:
            raise ValueError(f"stack_layer_params: layer {i} has entries "
                             f"{sorted(map(str, set(layers[i]) ^ names))} that layer 0 lacks "
                             "or the reverse")
    stacked = [(("blocks",) + name, jax.tree.map(lambda *xs: jnp.stack(xs),
                                                  *[layers[i][name] for i in range(n)]))
               for name in sorted(names, key=str)]
    return nnx.from_flat_state(rest + stacked)


def unstack_layer_params(params: nnx.State) -> nnx.State:
    """Inverse of :func:`stack_layer_params`: scanned layout -> unrolled layout (keys 0 .. N-1).

    Args:
      params: an ``nnx.State`` of a model with ``scan_layers=True`` (block leaves [N, ...]).

    Returns:
      an ``nnx.State`` that ``nnx.merge`` accepts with the graphdef of the unrolled model.

    Raises:
      ValueError: not a Transformer state, ``blocks`` already per-layer, or block leaves that do
        not share one leading layer axis.
    """
    flat = _flat_state(params, "unstack_layer_params")
    blocks = [(path, var) for path, var in flat if path[0] == "blocks"]
    rest = [(path, var) for path, var in flat if path[0] != "blocks"]
    if not blocks or any(isinstance(path[1], int) for path, _ in blocks):
        raise ValueError("unstack_layer_params: params['blocks'] is missing or already per-layer")
    lead = {x.shape[0] if x.ndim else None for _, var in blocks for x in jax.tree.leaves(var)}
    if len(lead) != 1 or None in lead:
        raise ValueError("unstack_layer_params: the blocks' leaves do not share one leading layer "
                         f"axis (leading sizes {sorted(lead, key=str)})")
    n = lead.pop()
    layers = [(("blocks", i) + path[1:], jax.tree.map(lambda x, i=i: x[i], var))
              for i in range(n) for path, var in blocks]
    return nnx.from_flat_state(rest + layers)


def _flat_state(params: nnx.State, where: str) -> list[tuple[tuple, Any]]:
    if not isinstance(params, nnx.State) or "blocks" not in params:
        raise ValueError(f"{where}: expected the nnx.State of a Transformer or Llama (with a "
                         f"'blocks' entry), got {type(params).__name__}")
    return list(nnx.to_flat_state(params))
