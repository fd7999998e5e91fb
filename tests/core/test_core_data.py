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


def test_a_single_file_holds_out_its_tail_from_a_line_break(tmp_path):
    # 20 lines of 10 bytes: 90% is byte 180, the start of a line, so the cut is right there;
    # 88% is byte 176, inside a line, so the cut moves past its line break (to byte 180 too)
    lines = [f"line {i:04d}\n" for i in range(20)]
    path = tmp_path / "notes.txt"
    path.write_text("".join(lines))
    whole = ByteTokenizer().encode(path.read_bytes())
    for val_fraction, cut in ((0.1, 180), (0.12, 180), (0.5, 100)):
        corpus = load_corpus(str(path), val_fraction=val_fraction)
        np.testing.assert_array_equal(np.concatenate([corpus.train, corpus.val]), whole)
        assert corpus.train.size == cut, val_fraction
        assert corpus.train_docs == (f"notes: first {cut / 200:.0%}",)
        assert corpus.val_docs == (f"notes: last {1 - cut / 200:.0%}",)
    # no line break after the cut: the cut is at the token itself
    (tmp_path / "one_line.txt").write_text("x" * 100)
    corpus = load_corpus(str(tmp_path / "one_line.txt"), val_fraction=0.1)
    assert (corpus.train.size, corpus.val.size) == (90, 10)


def test_too_little_text_or_no_document_is_one_error_naming_it(tmp_path):
    (tmp_path / "short.txt").write_text("x")
    with pytest.raises(ValueError, match=r"short.txt' has 1 token\(s\), too few to hold out 0.1"):
        load_corpus(str(tmp_path / "short.txt"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.md").write_text("not a .txt file")
    with pytest.raises(ValueError, match=r"no documents \(a folder is read for \*.txt files\)"):
        load_corpus(str(tmp_path / "folder"))


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
