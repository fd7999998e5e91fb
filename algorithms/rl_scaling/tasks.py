"""Verifiable arithmetic tasks with a difficulty knob and an exact-match checker.

Dimensions: N problems, k terms per problem, Lp prompt length (tokens, incl. BOS), T completion
length (tokens).

A problem is a sum of ``num_terms`` non-negative integers of at most ``num_digits`` digits, shown
to a byte-level model as ``<BOS>`` + left-space-padding + ``"a+b+c="`` with every term
zero-padded to ``num_digits`` digits (fixed digit positions); the one correct completion is
the decimal sum without leading zeros, written least-significant digit first (as in Lee et al.
2023, "Teaching Arithmetic to Small Transformers", Sec. 4, so that a small model can produce
carries in order), followed by the end byte ``"\\n"``: ``"57+68="`` -> ``"521\\n"`` (125).
More terms or more digits make a problem harder (longer carry chains, more digits to get right).
The reward is 1 for exactly that completion and 0 otherwise, including for truncated (no end
byte), padded, signed or otherwise malformed answers.

Train and held-out problems are disjoint by construction (:func:`make_split`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

VOCAB_SIZE = 258  # core.data.ByteTokenizer().vocab_size: 256 bytes, PAD, BOS
BOS_ID = 257  # core.data.ByteTokenizer().bos_id
END_ID = ord("\n")
PAD_ID = ord(" ")


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """A family of sums: ``num_terms`` terms, each uniform in [0, 10**num_digits).

    Attributes:
      num_terms: k >= 2.
      num_digits: digits per term, >= 1.
      name: label used in reports ("easy", "hard").
    """

    num_terms: int
    num_digits: int
    name: str = ""

    def __post_init__(self):
        if self.num_terms < 2 or self.num_digits < 1:
            raise ValueError(f"ArithmeticTask: need num_terms >= 2 and num_digits >= 1, got "
                             f"{self.num_terms}, {self.num_digits}")

    @property
    def prompt_chars(self) -> int:
        """Longest prompt text ("a+b+...=") in characters."""
        return self.num_terms * self.num_digits + self.num_terms

    @property
    def answer_chars(self) -> int:
        """Longest answer text incl. the end byte."""
        return len(str(self.num_terms * (10**self.num_digits - 1))) + 1

    @property
    def num_problems(self) -> int:
        return (10**self.num_digits) ** self.num_terms


def make_split(task: ArithmeticTask, num_train: int, num_heldout: int, seed: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint train and held-out problems: int64 operand arrays [num_train, k], [num_heldout, k].

    Problems are distinct ordered tuples drawn uniformly without replacement; the first
    ``num_heldout`` go to the held-out set.

    Raises:
      ValueError: more problems requested than the task has.
    """
    total = num_train + num_heldout
    if num_train < 1 or num_heldout < 1 or total > task.num_problems:
        raise ValueError(f"make_split: {num_train} train + {num_heldout} held-out problems "
                         f"requested; task {task} has {task.num_problems} (need >= 1 each)")
    rng = np.random.default_rng(seed)
    base = 10**task.num_digits
    if task.num_problems <= 4 * total:
        codes = rng.permutation(task.num_problems)[:total]
    else:
        seen: set[int] = set()
        out = []
        while len(out) < total:
            for c in rng.integers(0, task.num_problems, size=2 * (total - len(out))).tolist():
                if c not in seen:
                    seen.add(c)
                    out.append(c)
                    if len(out) == total:
                        break
        codes = np.asarray(out)
    ops = np.stack([(codes // base**i) % base for i in range(task.num_terms)], axis=1)
    return ops[num_heldout:].astype(np.int64), ops[:num_heldout].astype(np.int64)


def prompt_text(operands: np.ndarray, width: int) -> str:
    """``"a+b+...="`` for one problem (operands [k]), each term zero-padded to ``width`` digits."""
    return "+".join(str(int(a)).zfill(width) for a in operands) + "="


def encode_prompts(operands: np.ndarray, prompt_len: int, width: int) -> np.ndarray:
    """int32 [N, Lp]: BOS, left padding with spaces, then the prompt bytes (terms zero-padded to
    ``width`` digits, normally the task's ``num_digits``).

    Raises:
      ValueError: a prompt does not fit in ``prompt_len - 1`` bytes.
    """
    out = np.full((operands.shape[0], prompt_len), PAD_ID, np.int32)
    out[:, 0] = BOS_ID
    for i, ops in enumerate(operands):
        b = prompt_text(ops, width).encode()
        if len(b) > prompt_len - 1:
            raise ValueError(f"encode_prompts: prompt {b!r} needs {len(b) + 1} tokens > "
                             f"prompt_len={prompt_len}")
        out[i, prompt_len - len(b):] = np.frombuffer(b, np.uint8)
    return out


def answer_text(target: int) -> str:
    """The canonical answer text of a sum: its decimal digits, least significant first."""
    return str(int(target))[::-1]


def encode_answers(operands: np.ndarray, answer_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Target completions: (int32 [N, T] = :func:`answer_text` of the sum + END, padded with END;
    int32 [N] lengths incl. END).

    Raises:
      ValueError: an answer does not fit in ``answer_len`` tokens.
    """
    sums = operands.sum(axis=1)
    out = np.full((operands.shape[0], answer_len), END_ID, np.int32)
    lens = np.zeros(operands.shape[0], np.int32)
    for i, s in enumerate(sums):
        b = (answer_text(s) + "\n").encode()
        if len(b) > answer_len:
            raise ValueError(f"encode_answers: answer {b!r} needs {len(b)} tokens > "
                             f"answer_len={answer_len}")
        out[i, :len(b)] = np.frombuffer(b, np.uint8)
        lens[i] = len(b)
    return out, lens


def check_answer(completion: str, target: int) -> float:
    """The reference checker on text: 1.0 iff the completion, up to its first end byte, is
    :func:`answer_text` of ``target`` (reversed canonical decimal) and the end byte is present;
    else 0.0.

    Malformed answers score 0: missing end byte (truncated), trailing zeros (leading zeros of the
    number), the unreversed number (unless a palindrome), signs, spaces, separators, non-digits,
    empty answers.
    """
    if "\n" not in completion:
        return 0.0
    answer = completion.split("\n", 1)[0]
    return float(answer == answer_text(target))


def exact_match(tokens: jax.Array, target: jax.Array, target_len: jax.Array) -> jax.Array:
    """The checker on token ids, jittable: float32 [R] rewards.

    ``tokens`` [R, T] is a sampled completion, ``target`` [R, T] and ``target_len`` [R] the
    encoded answer (:func:`encode_answers`). Since the target ends with the end byte, matching its
    first ``target_len`` tokens means the completion stops exactly there with the right digits;
    what follows the end byte is ignored. Agrees with :func:`check_answer` on decoded text.
    """
    t = tokens.shape[1]
    valid = jnp.arange(t)[None, :] < target_len[:, None]
    ok = jnp.where(valid, tokens == target, True)
    return jnp.all(ok, axis=1).astype(jnp.float32)


class MixtureBatches:
    """Warm-start batches from two problem pools: each holds round(batch_size * hard_fraction) hard
    problems and the rest easy ones, drawn with replacement. Batch i depends only on (seed, i), so
    the ``position`` attribute makes the stream resumable (core.training.PositionedIterator).

    Raises:
      ValueError: hard_fraction outside [0, 1].
    """

    def __init__(self, easy: dict, hard: dict, batch_size: int, hard_fraction: float, seed: int):
        if not 0.0 <= hard_fraction <= 1.0:
            raise ValueError(f"MixtureBatches: need hard_fraction in [0, 1], got {hard_fraction}")
        self.easy, self.hard, self.batch_size, self.seed = easy, hard, batch_size, seed
        self.num_hard = int(round(batch_size * hard_fraction))
        self.position = 0

    def __next__(self):
        rng = np.random.default_rng((self.seed, self.position))
        self.position += 1
        ie = rng.integers(0, len(self.easy["lens"]), self.batch_size - self.num_hard)
        ih = rng.integers(0, len(self.hard["lens"]), self.num_hard)
        return {k: np.concatenate([self.easy[k][ie], self.hard[k][ih]]) for k in self.easy}


def encode_problems(operands: np.ndarray, task: ArithmeticTask, prompt_len: int, answer_len: int
                    ) -> dict[str, np.ndarray]:
    """{"prompts" int32 [N, Lp], "targets" int32 [N, T], "lens" int32 [N]} for the problems
    ``operands`` [N, k] of ``task`` (:func:`encode_prompts`, :func:`encode_answers`).

    Raises:
      ValueError: a prompt or answer does not fit in ``prompt_len`` / ``answer_len`` tokens.
    """
    targets, lens = encode_answers(operands, answer_len)
    return {"prompts": encode_prompts(operands, prompt_len, task.num_digits), "targets": targets,
            "lens": lens}


def geometry(tasks: tuple[ArithmeticTask, ...]) -> tuple[int, int]:
    """(Lp, T) shared by ``tasks``: Lp = 1 + the longest prompt (a leading BOS), T = the longest
    answer, in characters (tokens)."""
    return 1 + max(t.prompt_chars for t in tasks), max(t.answer_chars for t in tasks)


def problem_sets(tasks: tuple[ArithmeticTask, ...], num_train: int, num_heldout: int, seed: int
                 ) -> tuple[dict[str, dict], dict[str, dict], int, int]:
    """Encoded train and held-out problems of each task, in one shared geometry.

    Task i draws its split with seed ``seed + i`` (:func:`make_split`); prompts are padded to
    Lp = 1 + the longest prompt and answers to T = the longest answer of all tasks, so that one
    model and one compiled step serve every task.

    Returns:
      (train {task.name: :func:`encode_problems` dict}, held-out {name: dict}, Lp, T).
    """
    prompt_len, answer_len = geometry(tasks)
    train, heldout = {}, {}
    for i, t in enumerate(tasks):
        tr, ho = make_split(t, num_train, num_heldout, seed + i)
        train[t.name] = encode_problems(tr, t, prompt_len, answer_len)
        heldout[t.name] = encode_problems(ho, t, prompt_len, answer_len)
    return train, heldout, prompt_len, answer_len


def mixed_pool(easy: dict[str, np.ndarray], hard: dict[str, np.ndarray], size: int,
               hard_fraction: float) -> dict[str, np.ndarray]:
    """The RL training pool: the first ``size - round(size * hard_fraction)`` easy problems, then
    the first ``round(size * hard_fraction)`` hard ones (arrays keyed as :func:`encode_problems`).

    Raises:
      ValueError: hard_fraction outside [0, 1] or a split with fewer problems than it gives.
    """
    if not 0.0 <= hard_fraction <= 1.0:
        raise ValueError(f"mixed_pool: need hard_fraction in [0, 1], got {hard_fraction}")
    num_hard = int(round(size * hard_fraction))
    if len(easy["lens"]) < size - num_hard or len(hard["lens"]) < num_hard:
        raise ValueError(f"mixed_pool: {size - num_hard} easy and {num_hard} hard problems "
                         f"requested, the splits hold {len(easy['lens'])} and {len(hard['lens'])}")
    return {k: np.concatenate([easy[k][:size - num_hard], hard[k][:num_hard]])
            for k in ("prompts", "targets", "lens")}
