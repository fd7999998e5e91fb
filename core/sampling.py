"""Exact categorical sampling in float32: no Gumbel tail truncation, no float64.

Dimensions: V categories (the last axis of the logits), D = ceil(log2 V) levels of the tree.

Why not ``jax.random.categorical``. It draws ``argmax(logits + g)`` with Gumbel noise
``g = -log(-log u)`` from a float32 uniform ``u`` with 23 random bits (JAX's default
``mode="low"``), so ``g <= 15.9``: a category whose probability is below about 1e-7 of the most
likely one is under-sampled, and below about 1.4e-9 it is never drawn (JAX documents the 1e-7
limit; ``mode="high"`` moves it to about 1e-14 at twice the random bits per category). In a
masked-diffusion sampler the step's law is ``(unmask probability) x x_theta``, so with many steps
most of the vocabulary falls below the limit: Zheng et al. 2024, "Masked Diffusion Models are
Secretly Time-Agnostic Masked Models and Exploit Inaccurate Categorical Sampling" (arXiv
2409.02908) show that this truncation acts as a lowered temperature, which lowers the
generative perplexity and the entropy of the samples. Their remedy is float64 Gumbel noise; float64
needs ``jax_enable_x64`` and is slow or emulated on accelerators.

Method (exact in float32). The probabilities ``w = exp(logits - max)`` are the leaves of a binary
tree of partial sums (padded to 2^D leaves with zeros). A draw descends from the root: at a node
with children sums ``(L, R)`` it takes the smaller child with probability ``q = min(L, R) / (L + R)``
(``q <= 1/2``), decided by ``u < q`` with a fresh uniform ``u`` built from 64 random bits, whose
resolution is relative (float32 precision) down to ``2^-64``. So every branch probability is the
ratio of two float32 sums of non-negative numbers: no subtraction, no ``1 - p`` near 1, no
product of small numbers is ever formed. A category's probability is the product of its D branch
probabilities, each within a few float32 ulps of the exact ratio: the law drawn matches
``softmax(logits)`` to a relative error of order ``D^2 2^-24`` (4e-6 for D = 8, V = 256) for every
category whose probability is at least about ``2^-64 ~ 5e-20`` of its sibling subtree, i.e. at
any probability a sampler can ever observe. Cost: O(V) additions per law (the sums, and a one-hot
pick of the node's children at each level) and 2D random words per draw, where the Gumbel-max trick
needs V random words per draw; a law shared by many draws (``shape`` with extra leading axes, or
batch axes of size 1) is built once and each draw gathers its D pairs, O(D).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

_TWO_M32 = 2.0 ** -32
_TWO_M64 = 2.0 ** -64


def _uniform64(bits: jax.Array) -> jax.Array:
    """float32 uniforms in [0, 1] from uint32 pairs ``bits`` [2, ...]: ``hi 2^-32 + lo 2^-64``.

    ``P(u < q) = q`` up to a relative error of about ``2^-23`` for every float32 ``q`` in
    ``[2^-64, 1/2]`` (the value keeps float32's relative precision all the way down; ``hi``'s
    rounding to float32 only matters for ``u >= 2^-8``, where it is relative too).
    """
    hi, lo = bits[0], bits[1]
    return hi.astype(jnp.float32) * _TWO_M32 + lo.astype(jnp.float32) * _TWO_M64


def _check(logits, shape, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not hasattr(logits, "shape") or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"{where}: logits must be a floating-point array [..., V], got "
                         f"{type(logits).__name__} of dtype {getattr(logits, 'dtype', None)}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{where}: logits must have shape [..., V] with V >= 1, got "
                         f"{logits.shape}")
    batch = tuple(logits.shape[:-1])
    out = batch if shape is None else tuple(int(d) for d in shape)
    try:
        ok = jnp.broadcast_shapes(out, batch) == out
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{where}: shape={out} must be the logits' batch shape {batch} with "
                         f"optional leading axes (the batch shape broadcast to it)")
    if not isinstance(logits, jax.core.Tracer):
        values = np.asarray(logits, np.float32)
        has_nan = bool(np.isnan(values).any())
        if has_nan or np.isposinf(values).any():
            raise ValueError(f"{where}: logits must be finite or -inf (probability 0), got "
                             f"{'NaN' if has_nan else '+inf'}")
    return batch, out


def categorical(key: jax.Array, logits: jax.Array, *, shape: tuple[int, ...] | None = None
                ) -> jax.Array:
    """Draws indices from ``softmax(logits)`` along the last axis, exactly (see the module notes).

    A drop-in replacement for ``jax.random.categorical(key, logits, axis=-1, shape=shape)`` that
    does not under-sample small probabilities. jit-friendly (static shapes; a Python loop of D
    steps), float32 only, no ``jax_enable_x64``.

    Args:
      key: a PRNG key.
      logits: float [..., V] unnormalised log-probabilities (any float dtype; computed in
        float32). ``-inf`` is probability 0. A row with no finite logit gives index 0.
      shape: the result shape (default ``logits.shape[:-1]``): the batch shape, possibly with
        extra leading axes (independent draws from the same laws; the tree of each law is built
        once).

    Returns:
      int32 ``shape``, indices in ``[0, V)``; a category of probability 0 is never drawn (except
      index 0 of an all-``-inf`` row).

    Raises:
      ValueError: ``logits`` not a floating array [..., V] with V >= 1; ``shape`` not the batch
        shape with optional leading axes; concrete logits with NaN or ``+inf``.
    """
    _, out = _check(logits, shape, "categorical")
    return _categorical(key, logits, out)


@functools.partial(jax.jit, static_argnums=(2,))
def _categorical(key: jax.Array, logits: jax.Array, out: tuple[int, ...]) -> jax.Array:
    batch, v = tuple(logits.shape[:-1]), logits.shape[-1]
    if v == 1:
        return jnp.zeros(out, jnp.int32)
    depth = math.ceil(math.log2(v))
    x = jnp.asarray(logits, jnp.float32)
    top = jnp.max(x, axis=-1, keepdims=True)
    w = jnp.exp(x - jnp.where(jnp.isfinite(top), top, 0.0))             # [..., V] in [0, 1]
    w = jnp.pad(w, [(0, 0)] * len(batch) + [(0, 2 ** depth - v)])
    # levels[d] [..., 2^(d+1)]: the children of the 2^d nodes at depth d; node j's children are
    # j and j + 2^d (the index's bits are decided from the lowest up), so each level is the sum of
    # the two contiguous halves of the next (a strided pairing is ~10x slower on the CPU).
    levels = [w]
    for _ in range(depth - 1):
        half = levels[-1].shape[-1] // 2
        levels.append(levels[-1][..., :half] + levels[-1][..., half:])
    levels = levels[::-1]
    lead = (1,) * (len(out) - len(batch))
    u = _uniform64(jax.random.bits(key, (2, depth) + out, jnp.uint32))  # [depth, *out]
    node = jnp.zeros(out, jnp.int32)
    for d in range(depth):
        children = levels[d].reshape(lead + levels[d].shape)
        if out == batch:
            # One law per draw: pick the node's children with a one-hot mask, O(2^d) per draw
            # (O(V) over all levels, as for the sums); vectorises where a gather does not.
            hit = jnp.arange(2 ** d) == node[..., None]
            left = jnp.where(hit, children[..., :2 ** d], 0.0).sum(-1)     # exact: one term
            right = jnp.where(hit, children[..., 2 ** d:], 0.0).sum(-1)
        else:
            # Many draws per law: gather the two children, O(1) per draw and level.
            lr = jnp.take_along_axis(children, jnp.stack([node, node + 2 ** d], axis=-1),
                                     axis=-1, mode="promise_in_bounds")
            left, right = lr[..., 0], lr[..., 1]
        total = left + right
        q = jnp.where(total > 0, jnp.minimum(left, right) / jnp.where(total > 0, total, 1.0),
                      0.0)
        right_is_small = right <= left      # ties: either; both empty: q = 0 -> go left
        go_right = jnp.where(u[d] < q, right_is_small, ~right_is_small)
        node = node + go_right.astype(jnp.int32) * 2 ** d
    return node
