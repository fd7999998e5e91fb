"""Causal byte-level LM on the Shakespeare plays.

    python -m experiments.lm --config=experiments/configs/lm.py:tiny --workdir=workdir
    python -m experiments.lm --config=experiments/configs/lm.py:paper --workdir=gs://...  # accelerator
"""

import ml_collections

from core import config as cfg_lib


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.corpus = ""  # comma-separated text files or folders; empty = the Shakespeare plays
    c.val_fraction = 0.1
    # TransformerConfig fields (models/transformer.py); dtype is the compute dtype (parameters and
    # optimizer state stay float32), attention / remat select the training-length kernels.
    c.model = ml_collections.ConfigDict(dict(
        d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, max_len=256, mlp_dim=0,
        dtype="float32", attention="reference", attention_block=512, remat="none"))
    c.seq_len = 256  # = model.max_len: RoPE is only trained on positions below seq_len
    c.batch_size = 16
    c.steps = 400
    c.learning_rate = 3e-3
    c.warmup_steps = 50
    c.weight_decay = 0.1
    c.grad_clip = 1.0
    c.log_every = 25
    c.checkpoint_every = 200
    c.eval_windows = 256  # held-out windows of seq_len for val_bpb
    c.sample_len = 200
    c.model_parallelism = 1  # size of the mesh's model axis (tensor parallelism)
    c.param_sharding = "fsdp"  # "fsdp": FSDP over data + TP over model; "replicated": data parallel
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {"steps": 4, "log_every": 2, "checkpoint_every": 2, "eval_windows": 4, "sample_len": 8,
              "batch_size": 4, "seq_len": 32, "model.d_model": 32, "model.num_layers": 1,
              "model.num_heads": 2, "model.num_kv_heads": 1, "model.max_len": 64},
    "paper": {
        "model.d_model": 768, "model.num_layers": 12, "model.num_heads": 12,
        "model.num_kv_heads": 4, "model.max_len": 1024, "seq_len": 1024, "batch_size": 256,
        "steps": 50_000, "learning_rate": 6e-4, "warmup_steps": 2000, "eval_windows": 2048,
        "checkpoint_every": 1000, "log_every": 100,
        "model.dtype": "bfloat16", "model.attention": "blockwise", "model.remat": "minimal",
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
