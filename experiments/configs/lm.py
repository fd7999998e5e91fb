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

import dataclasses
from typing import Annotated, Literal

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

# The choices the library lists for a model's kernels.
Dtype = Literal[COMPUTE_DTYPES]
Attention = Literal[IMPLEMENTATIONS]
Remat = Literal[tuple(REMAT_POLICIES)]


@dataclasses.dataclass(frozen=True)
class TransformerFields:
    """``models.transformer.TransformerConfig`` fields as a config holds them: ``dtype`` by name is
    the compute dtype (parameters and optimizer state stay float32), ``attention`` / ``remat``
    select the training-length kernels. Bounds and how the fields fit together are the library's
    own checks, applied by :func:`check_model` (which builds the ``TransformerConfig``)."""

    d_model: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: cfg_lib.Count = 2  # the library reads 0 as "= num_heads"
    max_len: int = 256
    mlp_dim: cfg_lib.NonNegInt = 0  # 0 = the default width
    dtype: Dtype = "float32"
    attention: Attention = "reference"
    attention_block: int = 512
    remat: Remat = "none"


@dataclasses.dataclass(frozen=True)
class Model(TransformerFields):
    scan_layers: bool = False  # apply the blocks with one scan (one compiled block)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """AdamW with a linear warm-up and global-norm clipping (``algorithms.lm.training.optimizer``;
    ``algorithms.diffusion_lm.grid`` too)."""

    learning_rate: cfg_lib.Positive = 3e-3
    warmup_steps: cfg_lib.NonNegInt = 50
    weight_decay: cfg_lib.NonNegative = 0.1
    grad_clip: cfg_lib.Positive = 1.0


@dataclasses.dataclass(frozen=True)
class Training(Optimizer):
    """A language model's training run (``algorithms.lm.training.train``)."""

    model: TransformerFields = TransformerFields()
    # >= 2: a next-token loss needs two positions; = model.max_len: RoPE is only trained on
    # positions below seq_len
    seq_len: Annotated[int, cfg_lib.Range(2)] = 256
    batch_size: cfg_lib.Count = 16
    steps: cfg_lib.Count = 400
    log_every: cfg_lib.Count = 25
    checkpoint_every: cfg_lib.Count = 200

    def __post_init__(self):
        if self.warmup_steps > self.steps:  # it would never reach the rate nor start its decay
            raise cfg_lib.FieldError("expected warmup_steps <= steps (the warm-up would outlast "
                                     "training)", warmup_steps=self.warmup_steps, steps=self.steps)
        training.check_seq_len(self.seq_len, self.model.max_len)


@dataclasses.dataclass(frozen=True)
class Config(Training):
    model: Model = Model()
    seed: cfg_lib.NonNegInt = 0
    # The text to train and evaluate on: a text file, or comma-separated files / folders of them;
    # empty = the bundled Shakespeare plays (see the module docstring for the held-out split).
    data_path: cfg_lib.Paths = ""
    val_fraction: cfg_lib.OpenFraction = 0.1
    eval_windows: cfg_lib.Count = 256  # held-out windows of seq_len for val_bpb
    sample_len: cfg_lib.Count = 200
    model_parallelism: cfg_lib.Count = 1  # size of the mesh's model axis (tensor parallelism)
    # "fsdp": FSDP over data + TP over model; "replicated": data parallel
    param_sharding: Literal["fsdp", "replicated"] = "fsdp"
    claim: report.Claim = report.Claim(
        method="Transformer LM (foundation)",
        statement="held-out bpb well under the bigram baseline",
        checks=("val_bpb < bigram_bpb - 0.3",),
        ours="{val_bpb:.3f} vs bigram {bigram_bpb:.3f} bpb")

    def __post_init__(self):
        super().__post_init__()
        check_model(self.model, self.model_parallelism)


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


# One line for each field that --helpshort describes beside its default.
FIELD_HELP = {
    "data_path": "the text to train on: a text file, or comma-separated files / folders of *.txt; "
                 "'' = the bundled Shakespeare plays",
}


def check_model(model: TransformerFields, model_parallelism: int, prefix: str = "") -> None:
    """Builds the run's ``TransformerConfig`` (:func:`algorithms.lm.training.model_config`), so
    that the model's own checks apply (e.g. num_kv_heads divides num_heads, an even head
    dimension d_model / num_heads for RoPE), and checks that ``model_parallelism`` divides
    what tensor parallelism splits.

    Args:
      model: the config's model group.
      model_parallelism: the size of the mesh's model axis.
      prefix: where the model group's parent sits in the config (``"evaluator."``), for the
        field paths of the message.

    Raises:
      ValueError: one line naming the refused fields' paths (:func:`core.config.check_built`).
    """
    fields = {n: (f"{prefix}model.{n}", v) for n, v in dataclasses.asdict(model).items()}
    fields["model_parallelism"] = ("model_parallelism", model_parallelism)

    def build():
        group = ml_collections.ConfigDict({"model": dataclasses.asdict(model)})
        mcfg = training.model_config(group, ByteTokenizer().vocab_size)
        mcfg.check_model_parallelism(model_parallelism)
        return mcfg

    cfg_lib.check_built(build, fields, "TransformerConfig",
                        derived={"head_dim": ("d_model", "num_heads")})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, Config, VARIANTS)
