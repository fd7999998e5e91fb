"""Causal byte-level LM on the Shakespeare plays, or on your own text.

    python -m experiments.lm --config=experiments/configs/lm.py:tiny --workdir=workdir
    python -m experiments.lm --config=experiments/configs/lm.py:paper --workdir=gs://...  # accelerator
    python -m experiments.lm --workdir=workdir --config.data_path=my_text.txt

``data_path``: the text to train and evaluate on: a text file, or comma-separated files / folders
(each ``*.txt`` file in a folder is one document); empty = the bundled Shakespeare plays. Several
documents are split by whole document (every ``round(1 / val_fraction)``-th held out); a single file
is split into its first ``1 - val_fraction`` for training and the rest, from the next line break,
held out (:func:`core.data.text.load_corpus`).
"""

import ml_collections

from core import config as cfg_lib
from core import report


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # The text to train and evaluate on: a text file, or comma-separated files / folders of them;
    # empty = the bundled Shakespeare plays (see the module docstring for the held-out split).
    c.data_path = ""
    c.val_fraction = 0.1
    # TransformerConfig fields (models/transformer.py); dtype is the compute dtype (parameters and
    # optimizer state stay float32), attention / remat select the training-length kernels,
    # scan_layers applies the blocks with one scan (one compiled block).
    c.model = ml_collections.ConfigDict(dict(
        d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, max_len=256, mlp_dim=0,
        dtype="float32", attention="reference", attention_block=512, remat="none",
        scan_layers=False))
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
    c.claim = report.claim_config(
        method="Transformer LM (foundation)",
        statement="held-out bpb well under the bigram baseline",
        checks=("val_bpb < bigram_bpb - 0.3",),
        ours="{val_bpb:.3f} vs bigram {bigram_bpb:.3f} bpb")
    return c


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {"steps": 4, "warmup_steps": 2, "log_every": 2, "checkpoint_every": 2,
              "eval_windows": 4, "sample_len": 8,
              "batch_size": 4, "seq_len": 32, "model.d_model": 32, "model.num_layers": 1,
              "model.num_heads": 2, "model.num_kv_heads": 1, "model.max_len": 64},
    "paper": {
        "model.d_model": 768, "model.num_layers": 12, "model.num_heads": 12,
        "model.num_kv_heads": 4, "model.max_len": 1024, "seq_len": 1024, "batch_size": 256,
        "steps": 50_000, "learning_rate": 6e-4, "warmup_steps": 2000, "eval_windows": 2048,
        "checkpoint_every": 1000, "log_every": 100,
        # "auto": splash on TPU (compiled for v5e:4x4: 6.0 -> 4.6 GiB per chip, roofline MFU 19% ->
        # 23% against blockwise), cuDNN on GPU, blockwise elsewhere (models/attention.py)
        "model.dtype": "bfloat16", "model.attention": "auto", "model.remat": "minimal",
    },
}


# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "data_path": cfg_lib.path_or_empty(several=True),
    "val_fraction": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    "model.d_model": cfg_lib.integer(lo=1),
    "model.num_layers": cfg_lib.integer(lo=1),
    "model.num_heads": cfg_lib.integer(lo=1),
    "model.num_kv_heads": cfg_lib.integer(lo=1),
    "model.max_len": cfg_lib.integer(lo=2),
    "model.mlp_dim": cfg_lib.integer(lo=0),  # 0 = the default width
    "model.dtype": cfg_lib.one_of("float32", "bfloat16", "float16"),
    "model.attention": cfg_lib.one_of("reference", "blockwise", "cudnn", "splash", "auto"),
    "model.attention_block": cfg_lib.integer(lo=1),
    "model.remat": cfg_lib.one_of("none", "full", "minimal", "dots"),
    "model.scan_layers": cfg_lib.boolean(),
    "seq_len": cfg_lib.integer(lo=2),  # next-token loss needs two positions
    "batch_size": cfg_lib.integer(lo=1),
    "steps": cfg_lib.integer(lo=1),
    "learning_rate": cfg_lib.number(lo=0, lo_open=True),
    "warmup_steps": cfg_lib.integer(lo=0),
    "weight_decay": cfg_lib.number(lo=0),
    "grad_clip": cfg_lib.number(lo=0, lo_open=True),
    "log_every": cfg_lib.integer(lo=1),
    "checkpoint_every": cfg_lib.integer(lo=1),
    "eval_windows": cfg_lib.integer(lo=1),
    "sample_len": cfg_lib.integer(lo=1),
    "model_parallelism": cfg_lib.integer(lo=1),
    "param_sharding": cfg_lib.one_of("fsdp", "replicated"),
}


# One line for each field that --helpshort describes beside its default.
FIELD_HELP = {
    "data_path": "the text to train on: a text file, or comma-separated files / folders of *.txt; "
                 "'' = the bundled Shakespeare plays",
}


def check_heads(config: ml_collections.ConfigDict) -> None:
    """Grouped-query attention needs num_kv_heads to divide num_heads, and RoPE an even head
    dimension d_model / num_heads.

    Raises:
      ValueError: naming the fields.
    """
    m = config.model
    if m.num_heads % m.num_kv_heads:
        raise ValueError(f"config fields model.num_heads={m.num_heads} and model.num_kv_heads="
                         f"{m.num_kv_heads}: expected num_kv_heads to divide num_heads "
                         "(grouped-query attention)")
    if m.d_model % m.num_heads or (m.d_model // m.num_heads) % 2:
        raise ValueError(f"config fields model.d_model={m.d_model} and model.num_heads="
                         f"{m.num_heads}: expected d_model / num_heads to be an even integer "
                         "(the head dimension, rotated in pairs by RoPE)")


def check_seq_len(config: ml_collections.ConfigDict) -> None:
    """RoPE is trained only on positions below ``seq_len``, and the model holds ``model.max_len``.

    Raises:
      ValueError: ``seq_len > model.max_len``.
    """
    if config.seq_len > config.model.max_len:
        raise ValueError(f"config fields seq_len={config.seq_len} and model.max_len="
                         f"{config.model.max_len}: expected seq_len <= model.max_len")


CROSS_CHECKS = (check_heads, check_seq_len)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
