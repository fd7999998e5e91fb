"""One jitted step that trains or evaluates a family's model, with an optional parameter EMA.

Dimensions: B batch, L sequence.

``step(state, batch, key) -> (state, metrics)`` with ``state = {"params", "opt_state", "step"}``
(plus ``"ema"`` when ``ema_decay > 0``) and ``batch = {"x": int32 [B, L], "train": f32 scalar,
"ce": f32 scalar}``. With ``train = 1`` it is an optimizer step on the family's objective; with
``train = 0`` it returns the state unchanged and only reports metrics (of the EMA parameters if
kept), so training and validation share one compilation. ``ce`` selects the masked families'
objective (cross-entropy if 1, NELBO if 0), so MDLM and MDLM-CE share it too. Metrics: ``loss``
(training objective), ``nelbo`` (true NELBO, nats per token), ``grad_norm``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from algorithms.diffusion_lm.families import FamilySpec, nelbo_per_token, train_loss


def init_state(params: nnx.State, tx: optax.GradientTransformation, ema_decay: float = 0.0
               ) -> dict[str, Any]:
    """The initial state for :func:`make_step`."""
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
    if ema_decay > 0:
        state["ema"] = jax.tree.map(jnp.copy, params)
    return state


def make_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: FamilySpec,
              ema_decay: float = 0.0):
    """The pure train-or-evaluate step (see the module docstring). Jit it with the state donated.

    Raises:
      ValueError: ``ema_decay`` outside [0, 1).
    """
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"make_step: ema_decay={ema_decay} must be in [0, 1)")
    masked = spec.name in ("mdlm", "mdlm_ce")

    def step(state, batch, key):
        training = batch["train"] > 0
        params = state["params"]
        if ema_decay > 0:  # evaluate the EMA weights
            params = jax.tree.map(lambda p, e: jnp.where(training, p, e), params, state["ema"])

        def objective(p):
            return train_loss(spec, nnx.merge(graphdef, p), batch["x"], key,
                              ce_mix=batch["ce"] if masked else None)

        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
               "step": state["step"] + 1}
        if ema_decay > 0:
            new["ema"] = jax.tree.map(lambda e, p: ema_decay * e + (1 - ema_decay) * p,
                                      state["ema"], new["params"])
        new = jax.tree.map(lambda n, o: jnp.where(training, n, o), new, state)
        return new, {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}

    return step


def make_eval(graphdef: nnx.GraphDef, spec: FamilySpec, ema_decay: float = 0.0):
    """The pure held-out evaluation ``evaluate(state, batch, key) -> float32 [B]``: each window's
    true NELBO (nats per token; exact NLL for AR) at one antithetic time / mask draw, of the EMA
    parameters if kept. Forward passes only. With the same ``key`` it draws the same times and
    forward samples as :func:`make_step`'s ``nelbo`` metric (both split ``key`` as
    :func:`families.train_loss` does), so two families evaluated with one key share their times
    (common random numbers).

    Raises:
      ValueError: ``ema_decay`` outside [0, 1).
    """
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"make_eval: ema_decay={ema_decay} must be in [0, 1)")

    def evaluate(state, batch, key):
        params = state["ema"] if ema_decay > 0 else state["params"]
        return nelbo_per_token(spec, nnx.merge(graphdef, params), batch["x"], key).mean(axis=1)

    return evaluate
