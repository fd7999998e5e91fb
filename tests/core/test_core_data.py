import numpy as np
import pytest

from core.data import ByteTokenizer, TextBatcher, load_corpus
from core.data.text import sequential_windows


def test_tokenizer_round_trip_utf8_and_specials():
    tok = ByteTokenizer()
    text = "To be, or not to be — ça va?"
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.max() < 256
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.vocab_size == 258 and tok.mask_id == 256
    assert tok.decode([72, 105, tok.mask_id, 33]) == "Hi[MASK]!"


def test_shakespeare_split_is_by_whole_play():
    corpus = load_corpus(None, val_fraction=0.1)
    assert set(corpus.train_docs).isdisjoint(corpus.val_docs)
    assert len(corpus.val_docs) >= 3 and len(corpus.train_docs) >= 30
    assert not any(d.endswith("_f") for d in corpus.train_docs + corpus.val_docs)  # no Folio dupes
    # the held-out text is not a substring of the training text (whole plays held out)
    val_snippet = corpus.val[1000:1200].astype(np.uint8).tobytes()
    assert val_snippet not in corpus.train.astype(np.uint8).tobytes()


def test_corpus_from_files_and_errors(tmp_path):
    for i in range(4):
        (tmp_path / f"doc{i}.txt").write_text(f"document number {i}\n" * 10)
    corpus = load_corpus(str(tmp_path), val_fraction=0.25)
    assert corpus.val_docs == ("doc1",)
    assert corpus.train_docs == ("doc0", "doc2", "doc3")
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_corpus([str(missing)])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    (tmp_path / "empty" / "b.txt").write_text("x")
    with pytest.raises(ValueError, match="a.txt.*empty"):
        load_corpus(str(tmp_path / "empty"))


def test_batcher_is_a_pure_function_of_position():
    tokens = np.arange(1000, dtype=np.int32)
    a = TextBatcher(tokens, batch_size=4, seq_len=16, seed=3)
    first = [next(a) for _ in range(5)]
    b = TextBatcher(tokens, batch_size=4, seq_len=16, seed=3, position=3)
    np.testing.assert_array_equal(next(b), first[3])
    assert first[0].shape == (4, 16)
    # windows are contiguous slices of the token array
    np.testing.assert_array_equal(np.diff(first[0], axis=1), 1)
    with pytest.raises(ValueError, match="shorter than seq_len"):
        TextBatcher(tokens[:10], 2, 16)


def test_sequential_windows():
    w = sequential_windows(np.arange(103), 10)
    assert w.shape == (10, 10) and w[3, 0] == 30
    assert sequential_windows(np.arange(103), 10, max_windows=3).shape == (3, 10)
