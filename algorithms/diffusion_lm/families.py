"""The six model families compared by Sahoo et al. 2026 and their shared entry points.

Dimensions: B batch, L sequence, V vocabulary, T sampling steps.

A :class:`FamilySpec` (frozen, hashable) names a family and fixes its forward process, objective,
time conditioning and attention. For any spec:

* :func:`transformer_config` gives the backbone's :class:`models.transformer.TransformerConfig`;
* :func:`train_loss` ``(spec, model, x, key) -> (loss, aux)`` is the training objective (for
  ``core.training.make_train_step``);
* :func:`nelbo_per_token` ``(spec, model, x, key) -> [B, L]`` is the true NELBO (exact NLL for AR)
  used for every validation number: perplexity bound ``exp(mean)``, bits per byte ``mean / ln 2``;
* :func:`sample` ``(spec, graphdef, params, key, B, L, num_steps) -> int32 [B, L]`` generates.

Families: ``ar`` (causal, exact NLL), ``mdlm`` (masked, NELBO-weighted loss), ``mdlm_ce`` (masked,
plain cross-entropy loss), ``duo`` (uniform state, closed-form NELBO, conditioned on
``sigma = -log alpha_t``), ``esolm`` (AR <-> masked; trained as the authors' scaling runs do, with
``alpha_0 = 1`` and the cross-entropy objective, ``alpha_0 < 1`` only at sampling), ``esolm_nelbo``
(the ablation: trained with ``alpha_0 < 1`` and the NELBO, AR part included), ``gidd`` (mask <->
uniform, ``p_u``, clipped or "dynamic" weights for training).

Time convention: every NELBO estimate here averages the integrand over ``t ~ U[t_min, 1]``
(antithetic), i.e. it estimates ``(1 / (1 - t_min)) int_{t_min}^1 L_t dt``, not ``int_0^1``; the
omitted slice near clean data is why such estimates can read slightly low (Duo's by about 0.3% at
``t_min = 1e-3``). The integrands themselves are valid on all of [0, 1] (see :mod:`processes`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from algorithms.diffusion_lm import esolm
from algorithms.diffusion_lm.losses import (
    WEIGHTINGS,
    ar_nll,
    duo_nelbo,
    masked_ce,
    masked_nelbo,
    masked_weight,
    mixing_nelbo,
    shift_right,
)
from algorithms.diffusion_lm.processes import Process, antithetic_times, denoiser_log_probs
from core import sampling
from core.data.text import ByteTokenizer
from models.transformer import TransformerConfig

FAMILIES = ("ar", "mdlm", "mdlm_ce", "duo", "esolm", "esolm_nelbo", "gidd")
ESOLM = ("esolm", "esolm_nelbo")
_BYTES = ByteTokenizer()


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """Static description of a family.

    Attributes:
      name: one of :data:`FAMILIES`.
      vocab_size: V (data ids ``0..num_classes-1`` plus ``[MASK]`` and ``[BOS]``); the defaults
        of the four ids are :class:`core.data.text.ByteTokenizer`'s.
      num_classes: N data ids.
      mask_id, bos_id: special ids (``>= num_classes``).
      eps: schedule floor (``alpha_1 = eps``), in (0, 1).
      t_min: smallest training / evaluation time (MDLM's sampling eps): times are drawn from
        ``U[t_min, 1]``, the stated convention of every NELBO estimate (module docstring).
      alpha0: Eso-LM's clean fraction at ``t = 0`` in training ``esolm_nelbo`` (``esolm``
        trains at ``alpha_0 = 1``).
      sampling_alpha0: Eso-LM's clean fraction at ``t = 0`` when sampling (both Eso-LM
        families), in (0, 1]: the authors pass alpha_0 at sampling time, apart from training.
      p_uniform: GIDD's uniform share.
      gidd_max_weight: cap of GIDD's training weights.
      gidd_weighting: GIDD's training weights: ``"clip"`` (the ELBO weights capped at
        ``gidd_max_weight``) or ``"dynamic"`` (:func:`losses.gidd_dynamic_weight`, the authors'
        default).

    Raises:
      ValueError: unknown name or weighting; invalid process parameters (see :class:`Process`).
    """

    name: str
    vocab_size: int = _BYTES.vocab_size
    num_classes: int = _BYTES.vocab_size - len(_BYTES.SPECIALS)
    mask_id: int = _BYTES.mask_id
    bos_id: int = _BYTES.bos_id
    eps: float = 1e-3
    t_min: float = 1e-3
    alpha0: float = 0.5
    p_uniform: float = 0.1
    gidd_max_weight: float = 2.0
    sampling_alpha0: float = 0.5
    gidd_weighting: str = "dynamic"

    def __post_init__(self):
        if self.name not in FAMILIES:
            raise ValueError(f"FamilySpec.name={self.name!r}: expected one of {FAMILIES}")
        if self.gidd_weighting not in WEIGHTINGS:
            raise ValueError(f"FamilySpec.gidd_weighting={self.gidd_weighting!r}: expected one of "
                             f"{WEIGHTINGS}")
        if not 0.0 < self.sampling_alpha0 <= 1.0:
            raise ValueError(f"FamilySpec: sampling_alpha0={self.sampling_alpha0} must be in "
                             "(0, 1]")
        if not self.num_classes <= self.bos_id < self.vocab_size:
            raise ValueError(f"FamilySpec: bos_id={self.bos_id} must be a non-data id in "
                             f"[{self.num_classes}, {self.vocab_size})")
        if not 0.0 < self.t_min < 1.0:
            raise ValueError(f"FamilySpec: t_min={self.t_min} must be in (0, 1)")
        _ = self.sampling_process  # validates the process parameters

    @property
    def process(self) -> Process | None:
        """The forward process of training and of the validation NELBO (``None`` for AR)."""
        common = dict(vocab_size=self.vocab_size, num_classes=self.num_classes, eps=self.eps)
        if self.name == "ar":
            return None
        if self.name in ("mdlm", "mdlm_ce", "esolm"):  # esolm trains at alpha_0 = 1
            return Process("masked", mask_id=self.mask_id, **common)
        if self.name == "esolm_nelbo":
            return Process("masked", mask_id=self.mask_id, alpha0=self.alpha0, **common)
        if self.name == "duo":
            return Process("uniform", **common)
        return Process("gidd", mask_id=self.mask_id, p_uniform=self.p_uniform, **common)

    @property
    def sampling_process(self) -> Process | None:
        """The process the sampler reverses: Eso-LM's families at ``sampling_alpha0``, else
        :attr:`process`."""
        if self.name in ESOLM:
            return dataclasses.replace(self.process, alpha0=self.sampling_alpha0)
        return self.process

    @property
    def train_passes(self) -> tuple[int, ...]:
        """Lengths (in units of L) of the forward passes of one training example: Eso-LM's NELBO
        with ``alpha_0 < 1`` adds its 2L-token AR pass. For FLOPs accounting."""
        return (1, 2) if self.name == "esolm_nelbo" and self.alpha0 < 1 else (1,)

    @property
    def time_conditioning(self) -> bool:
        """Duo and GIDD condition on sigma; masked models infer t from the mask count (MDLM)."""
        return self.name in ("duo", "gidd")

    @property
    def causal(self) -> bool:
        return self.name == "ar"


def transformer_config(spec: FamilySpec, seq_len: int, **kw) -> TransformerConfig:
    """The backbone for ``spec`` (``max_len = 2 seq_len``: room for the BOS-prompted AR sampler and
    Eso-LM's 2L training sequence). ``kw`` are the size fields (d_model, num_layers, ...)."""
    return TransformerConfig(vocab_size=spec.vocab_size, max_len=2 * seq_len, causal=spec.causal,
                             time_conditioning=spec.time_conditioning, **kw)


def _apply(spec: FamilySpec, model, z: jax.Array, t: jax.Array) -> jax.Array:
    cond = spec.process.sigma(t) if spec.time_conditioning else None
    return model(z, cond)


def _eso_apply(model):
    return lambda tokens, positions, mask: model(tokens, positions=positions, mask=mask)


def per_token_terms(spec: FamilySpec, model, x: jax.Array, key: jax.Array, t: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """(training integrand, true NELBO integrand), float32 [B, L] each, at times ``t`` [B] in
    [0, 1] (both >= 0; finite on [0, 1] except GIDD's at ``t = 0``, see :mod:`processes`).

    ``esolm``'s training integrand is the plain cross-entropy on masked tokens (its NELBO weight
    ``-alpha'_t / (1 - alpha_t)`` dropped, as for ``mdlm_ce``); its NELBO is that of
    :attr:`FamilySpec.process` (``alpha_0 = 1``: masked diffusion in Eso-LM's attention order).
    """
    if spec.name == "ar":
        nll = ar_nll(model(shift_right(x, spec.bos_id)), x)
        return nll, nll
    proc = spec.process
    if spec.name in ESOLM:
        diff, ar = esolm.nelbo_terms(_eso_apply(model), proc, x, key, t)
        if spec.name == "esolm":  # alpha_0 = 1: ar == 0; diff = weight * CE on masked tokens
            weight = masked_weight(proc, t)[:, None]
            return jnp.where(diff > 0, diff / weight, 0.0), diff
        return diff + ar, diff + ar
    z_t = proc.sample(key, x, t)
    logp = denoiser_log_probs(proc, _apply(spec, model, z_t, t), z_t)
    if spec.name in ("mdlm", "mdlm_ce"):
        nelbo = masked_nelbo(proc, logp, x, z_t, t)
        return (masked_ce(proc, logp, x, z_t) if spec.name == "mdlm_ce" else nelbo), nelbo
    if spec.name == "duo":
        nelbo = duo_nelbo(proc, logp, x, z_t, t)
        return nelbo, nelbo
    nelbo = mixing_nelbo(proc, logp, x, z_t, t)
    return mixing_nelbo(proc, logp, x, z_t, t, max_weight=spec.gidd_max_weight,
                        weighting=spec.gidd_weighting), nelbo


def train_loss(spec: FamilySpec, model, x: jax.Array, key: jax.Array,
               ce_mix: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean training objective over the batch and positions (antithetic times), with the true
    NELBO per token as an auxiliary metric (``nelbo``).

    Args:
      ce_mix: masked families only: a (traced) scalar in [0, 1] selecting the objective,
        ``ce_mix * CE + (1 - ce_mix) * NELBO``, so that ``mdlm`` and ``mdlm_ce`` share one
        compiled step (``None``: the spec's own objective).
    """
    if ce_mix is not None and spec.name not in ("mdlm", "mdlm_ce"):
        raise ValueError(f"train_loss: ce_mix applies to the masked families, not {spec.name!r}")
    k_t, k_z = jax.random.split(key)
    t = antithetic_times(k_t, x.shape[0], spec.t_min)
    train, nelbo = per_token_terms(spec, model, x, k_z, t)
    if ce_mix is not None:
        weight = -spec.process.alpha_prime(t) / (1.0 - spec.process.alpha(t))
        ce = nelbo / weight[:, None]  # masked_nelbo = weight * masked_ce exactly
        train = ce_mix * ce + (1.0 - ce_mix) * nelbo
    return train.mean(), {"nelbo": nelbo.mean()}


def nelbo_per_token(spec: FamilySpec, model, x: jax.Array, key: jax.Array) -> jax.Array:
    """The true per-token NELBO integrand at antithetic times (exact NLL for AR). float32 [B, L];
    its mean over many batches / keys estimates the NELBO in nats per token."""
    k_t, k_z = jax.random.split(key)
    t = antithetic_times(k_t, x.shape[0], spec.t_min)
    return per_token_terms(spec, model, x, k_z, t)[1]


def sample(spec: FamilySpec, graphdef: nnx.GraphDef, params: nnx.State, key: jax.Array, *,
           batch_size: int, seq_len: int, num_steps: int) -> jax.Array:
    """Unconditional samples int32 [B, L] (data ids only; no ``[MASK]`` left).

    AR decodes with the KV cache from a ``[BOS]`` prompt (``num_steps`` is ignored: L steps);
    ``esolm`` uses :func:`esolm.sample`; the others the ancestral sampler
    ``z_s ~ q(z_s | z_t, x_theta)`` over ``num_steps`` uniform steps from ``t = 1`` to 0 (MDLM Eq. 7;
    Duo's exact posterior; GIDD's), drawn by :meth:`Process.posterior_sample`. ``num_steps``
    (int32 scalar, >= 1) is traced, so one compilation serves every steps setting.

    Every draw is exact in float32 (:func:`core.sampling.categorical`, and a denoised token is
    drawn from ``x_theta`` alone, never from (unmask probability) x ``x_theta``): the Gumbel-max
    draw used before under-sampled tokens below about 1e-7 of a step's most likely outcome, which
    at many steps is most of the vocabulary (Zheng et al. 2024, arXiv 2409.02908).

    Raises:
      ValueError: ``num_steps < 1``, ``batch_size < 1`` or ``seq_len < 1``.
    """
    if int(num_steps) < 1:
        raise ValueError(f"sample: num_steps={num_steps} must be >= 1")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"sample: batch_size={batch_size}, seq_len={seq_len} must be >= 1")
    if spec.name in ("mdlm_ce", "esolm_nelbo"):  # same sampler as mdlm / esolm: share it
        spec = dataclasses.replace(spec, name="mdlm" if spec.name == "mdlm_ce" else "esolm")
    return _sample(spec, graphdef, params, key, batch_size=batch_size, seq_len=seq_len,
                   num_steps=jnp.asarray(num_steps, jnp.int32))


@functools.partial(jax.jit, static_argnames=("spec", "graphdef", "batch_size", "seq_len"))
def _sample(spec, graphdef, params, key, *, batch_size, seq_len, num_steps):
    model = nnx.merge(graphdef, params)
    if spec.name == "ar":
        return _ar_sample(spec, model, key, batch_size, seq_len)
    proc = spec.sampling_process
    if spec.name in ESOLM:
        return esolm.sample(_eso_apply(model), proc, key, batch_size, seq_len, num_steps)
    num_steps = jnp.asarray(num_steps, jnp.int32)
    k0, kl = jax.random.split(key)

    def step(i, z):
        t = jnp.full((batch_size,), 1.0 - i / num_steps, jnp.float32)
        s = jnp.full((batch_size,), 1.0 - (i + 1) / num_steps, jnp.float32)
        logp = denoiser_log_probs(proc, _apply(spec, model, z, t), z)
        return proc.posterior_sample(jax.random.fold_in(kl, i), z, logp, s[:, None], t[:, None])

    # At s = 0 every process has alpha = 1 and q_0(.|x_theta) = x_theta: no [MASK] survives.
    return jax.lax.fori_loop(0, num_steps, step, proc.prior_sample(k0, (batch_size, seq_len)))


def _ar_sample(spec: FamilySpec, model, key: jax.Array, batch_size: int, seq_len: int
               ) -> jax.Array:
    """KV-cache ancestral decoding from ``[BOS]`` at temperature 1 over data ids only (the same
    prefill + ``lax.scan`` structure as :func:`models.sampling.generate`, whose sampler may emit
    special ids)."""
    cache = model.init_cache(batch_size, seq_len + 1)
    bos = jnp.full((batch_size, 1), spec.bos_id, jnp.int32)
    logits, cache = model.decode(bos, cache, jnp.zeros((batch_size,), jnp.int32))

    def body(carry, key_i):
        cache, last, pos = carry
        tok = sampling.categorical(key_i, last[..., :spec.num_classes])  # data ids 0..N-1
        logits, cache = model.decode(tok[:, None], cache, pos)
        return (cache, logits[:, 0], pos + 1), tok

    keys = jax.random.split(key, seq_len)
    init = (cache, logits[:, 0], jnp.ones((batch_size,), jnp.int32))
    return jax.lax.scan(body, init, keys)[1].T
