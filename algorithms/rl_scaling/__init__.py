"""Compute-optimal RL post-training: GRPO / Dr.GRPO in JAX and the IsoCompute allocation of
rollouts per problem (n) x problems per batch (B_p) x update steps (M) under a rollout budget
C = n * B_p * M (Cheng et al. 2026, "IsoCompute Playbook", arXiv:2603.12151).

Modules: :mod:`grpo` (advantages, clipped loss, k3 KL), :mod:`tasks` (verifiable arithmetic with a
difficulty knob and an exact-match checker), :mod:`rollout` (jitted KV-cache sampling that stops at
an end token), :mod:`trainer` (the jitted RL and warm-start steps), :mod:`metrics` (pass@k,
interference), :mod:`allocation` (budget bookkeeping), :mod:`fit` (n*(C) and its scaling fits).
"""
