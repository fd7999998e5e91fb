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

from algorithms.lm import training
from core import config as cfg_lib
from core import report
from core.data.text import ByteTokenizer
from models.attention import IMPLEMENTATIONS
from models.transformer import COMPUTE_DTYPES, REMAT_POLICIES

# Not part of the main job (`make run`): the experiments measure a pretrained model by default, and
# kv_quant / sparse_decode train this byte-level lm themselves when asked to measure it
# (checkpoint=""); `make run EXPERIMENTS=lm` runs it (registry.resolve).
MAIN_JOB = False


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


def model_rules(prefix: str = "model.", names: tuple[str, ...] | None = None
                ) -> dict[str, cfg_lib.Rule]:
    """Rules of the ``TransformerConfig`` fields of an LM config's ``model`` group under
    ``prefix`` (``names``: the group's fields, default all): the kind of each value, and the
    choices the library lists. Bounds and how the fields fit together are the library's own
    checks, applied by :func:`check_model` (which builds the ``TransformerConfig``)."""
    rules = {
        "d_model": cfg_lib.integer(), "num_layers": cfg_lib.integer(),
        "num_heads": cfg_lib.integer(),
        "num_kv_heads": cfg_lib.integer(lo=1),  # the library reads 0 as "= num_heads"
        "max_len": cfg_lib.integer(),
        "mlp_dim": cfg_lib.integer(lo=0),  # 0 = the default width
        "dtype": cfg_lib.one_of(*COMPUTE_DTYPES), "attention": cfg_lib.one_of(*IMPLEMENTATIONS),
        "attention_block": cfg_lib.integer(), "remat": cfg_lib.one_of(*REMAT_POLICIES),
        "scan_layers": cfg_lib.boolean(),
    }
    return {prefix + n: r for n, r in rules.items() if names is None or n in names}


# What each field accepts (checked once every override is in, before any work).
RULES = {
    "seed": cfg_lib.integer(lo=0),
    "data_path": cfg_lib.path_or_empty(several=True),
    "val_fraction": cfg_lib.number(lo=0, hi=1, lo_open=True, hi_open=True),
    **model_rules(),
    **cfg_lib.training_rules(),
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


def check_model(config: ml_collections.ConfigDict, prefix: str = "") -> None:
    """Builds the run's ``TransformerConfig`` (:func:`algorithms.lm.training.model_config`), so
    that the model's own checks apply (e.g. num_kv_heads divides num_heads, an even head
    dimension d_model / num_heads for RoPE), and checks that ``model_parallelism`` divides
    what tensor parallelism splits.

    Args:
      config: an LM config (this module's, or ``algorithms.diffusion_lm.evaluator``'s
        ``evaluator_config``).
      prefix: where ``config`` sits in the config being validated (``"evaluator."``), for
        the field paths of the message.

    Raises:
      ValueError: one line naming the refused fields' paths (:func:`core.config.check_built`).
    """
    fields = {n: (f"{prefix}model.{n}", v) for n, v in config.model.items()}
    fields["model_parallelism"] = ("model_parallelism", config.model_parallelism)

    def build():
        mcfg = training.model_config(config, ByteTokenizer().vocab_size)
        mcfg.check_model_parallelism(config.model_parallelism)
        return mcfg

    cfg_lib.check_built(build, fields, "TransformerConfig",
                        derived={"head_dim": ("d_model", "num_heads")})


def check_seq_len(config: ml_collections.ConfigDict) -> None:
    """RoPE is trained only on positions below ``seq_len``, and the model holds ``model.max_len``.

    Raises:
      ValueError: ``seq_len > model.max_len``.
    """
    if config.seq_len > config.model.max_len:
        raise ValueError(f"config fields seq_len={config.seq_len} and model.max_len="
                         f"{config.model.max_len}: expected seq_len <= model.max_len")


CROSS_CHECKS = (check_model, check_seq_len)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
