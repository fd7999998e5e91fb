"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer", Sec. 3.4.2), half-split form.

Dimensions: B batch, L positions, N heads, D head dim (even).

The frequencies are either the plain ``base^(-2i/D)`` of a float ``base`` or those of a
:class:`RotaryEmbedding`, which adds the context-extension rescalings that Llama-family
checkpoints declare in ``config.json`` (``rope_scaling`` / ``rope_parameters``): linear position
interpolation (Chen et al. 2023), Llama 3.1's smooth per-band rescaling, and YaRN (Peng et al.
2023, Sec. 3.2-3.4). Every function here that takes ``base`` accepts either form, so a cache that
re-applies RoPE to stored keys (QVG) uses exactly the model's frequencies.

The rotation itself (:func:`kernels.rope.apply_rope`, :func:`kernels.rope.rope_angles`) lives in
:mod:`kernels.rope`, where the KV-cache kernels use it too; it accepts a float base or any object
with an ``inv_freq(head_dim)`` method, such as :class:`RotaryEmbedding`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

ROPE_KINDS = ("default", "linear", "llama3", "yarn")
__all__ = ["ROPE_KINDS", "RotaryEmbedding"]


@dataclasses.dataclass(frozen=True)
class RotaryEmbedding:
    """RoPE frequencies of a checkpoint (hashable: usable as a static jit argument).

    Attributes:
      theta: the base wavelength (``rope_theta``), > 1.
      kind: one of :data:`ROPE_KINDS`.
      factor: context-extension factor s >= 1 (``linear``, ``llama3``, ``yarn``).
      low_freq_factor, high_freq_factor: Llama 3.1's band edges (``llama3``): wavelengths above
        ``original_max_len / low_freq_factor`` are divided by ``factor``, those below
        ``original_max_len / high_freq_factor`` are kept, the band between is interpolated.
      original_max_len: the pre-training context length L (``original_max_position_embeddings``;
        ``llama3`` and ``yarn``).
      beta_fast, beta_slow: YaRN's ramp edges in rotations over L (paper Eq. 18; 32 and 1).
      attention_factor: YaRN's logit temperature mscale; ``None`` derives it from ``factor`` (and
        ``mscale`` / ``mscale_all_dim`` when both are set) as ``0.1 ln s + 1`` (paper Eq. 22).
      mscale, mscale_all_dim: the DeepSeek-style variant of that derivation.
      truncate: round YaRN's ramp edges outwards to whole dimensions (the reference default).

    Raises:
      ValueError: unknown ``kind``, ``theta <= 1``, ``factor < 1`` where it applies, or a missing
        ``original_max_len`` for ``llama3`` / ``yarn``.
    """

    theta: float = 10_000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self):
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"RotaryEmbedding: kind={self.kind!r} is not supported; expected one "
                             f"of {ROPE_KINDS}")
        if not self.theta > 1.0:
            raise ValueError(f"RotaryEmbedding: theta={self.theta} must be > 1")
        if self.kind != "default" and not self.factor >= 1.0:
            raise ValueError(f"RotaryEmbedding: factor={self.factor} must be >= 1 for "
                             f"kind={self.kind!r}")
        if self.kind in ("llama3", "yarn") and not (self.original_max_len or 0) > 0:
            raise ValueError(f"RotaryEmbedding: kind={self.kind!r} needs original_max_len > 0, "
                             f"got {self.original_max_len}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError("RotaryEmbedding: llama3 needs high_freq_factor > low_freq_factor > 0, "
                             f"got {self.high_freq_factor} and {self.low_freq_factor}")

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """Angular frequencies float32 [D/2] in radians per position, computed in float64.

        Raises:
          ValueError: ``head_dim`` odd or < 2.
        """
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"RotaryEmbedding.inv_freq: head_dim={head_dim} must be even and >= 2")
        d = head_dim
        base = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        if self.kind == "default":
            out = base
        elif self.kind == "linear":
            out = base / self.factor
        elif self.kind == "llama3":
            old = float(self.original_max_len)
            low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
            wavelen = 2 * math.pi / base
            smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor
                                                                - self.low_freq_factor)
            mid = (1 - smooth) * base / self.factor + smooth * base
            out = np.where(wavelen > low_wavelen, base / self.factor,
                           np.where(wavelen < high_wavelen, base, mid))
        else:  # yarn: ramp from interpolation (low frequencies) to extrapolation (high ones)
            def dim_of(rotations):  # dimension index that makes `rotations` turns over L
                return (d * math.log(self.original_max_len / (rotations * 2 * math.pi))
                        / (2 * math.log(self.theta)))

            low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
            extrapolate = 1.0 - ramp
            out = base / self.factor * (1.0 - extrapolate) + base * extrapolate
        return np.asarray(out, np.float32)

    @property
    def attention_scale(self) -> float:
        """Factor m that YaRN applies to both cos and sin (so logits scale by m^2); 1 otherwise."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)

        def get(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return float(get(self.factor, self.mscale) / get(self.factor, self.mscale_all_dim))
        return float(get(self.factor))
