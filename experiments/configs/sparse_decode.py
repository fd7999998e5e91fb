"""Sparse long-context decoding: FFD (2-bit key scan + top-delta pages) against dense and Quest.

    python -m experiments.sparse_decode --config=experiments/configs/sparse_decode.py:tiny --workdir=workdir
    python -m experiments.sparse_decode --config=experiments/configs/sparse_decode.py:paper --workdir=workdir
"""

import ml_collections

from core import config as cfg_lib


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # speed workload (the paper's geometry): 32 query / 8 kv heads, D = 128, pages of 128
    c.contexts = (4096, 16384, 65536)
    c.batch_sizes = (1,)
    c.num_heads = 32
    c.num_kv_heads = 8
    c.head_dim = 128
    c.page_size = 128
    c.delta = 6.0  # nats
    c.max_density = 0.08  # XLA gather budget as a fraction of the pages
    c.timing_reps = 3
    c.bandwidth_mb = 256  # array summed to measure the read bandwidth
    # quality on keys/values/queries captured from the trained lm on held-out text
    c.real_context = 8192
    c.real_page_size = 32
    c.real_queries = 8  # decode positions evaluated per layer
    # needle test
    c.needle_context = 16384
    c.needles = 4
    c.needle_trials = 4
    # greedy decoding of the trained lm with FFD at a large delta
    c.greedy_prompt = 96
    c.greedy_new = 64
    c.greedy_page_size = 16
    c.lm_config = ""  # variant of the lm experiment whose checkpoint is decoded; "" = tiny
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {"contexts": (2048,), "timing_reps": 1, "bandwidth_mb": 16, "real_context": 1024,
              "real_queries": 2, "needle_context": 2048, "needles": 2, "needle_trials": 1,
              "greedy_prompt": 16, "greedy_new": 8, "greedy_page_size": 8, "lm_config": "smoke"},
    "paper": {"contexts": (4096, 16384, 65536, 131072, 262144), "batch_sizes": (1, 8),
              "timing_reps": 10, "bandwidth_mb": 1024, "real_context": 65536,
              "real_queries": 32, "needle_context": 131072, "needle_trials": 16},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
