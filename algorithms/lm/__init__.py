"""The byte-level causal transformer LM: training (:mod:`algorithms.lm.training`) and held-out
evaluation against n-gram baselines (:mod:`algorithms.lm.evaluation`). The KV-cache experiments
decode with the model trained here."""
