"""Data: reading data files (:mod:`core.data.files`), text corpora, the byte-level tokenizer,
checkpointable batch iterators, readers of pairwise-judgement files, and the papers' public data
sets by name, downloaded once into a cache (:mod:`core.data.download`)."""

from core.data.files import check_file, read_bytes, read_text
from core.data.judgments import Judgments, read_judgments
from core.data.text import (
    ByteTokenizer,
    Corpus,
    TextBatcher,
    load_corpus,
    shakespeare_files,
)

__all__ = ["ByteTokenizer", "Corpus", "Judgments", "TextBatcher", "check_file", "load_corpus",
           "read_bytes", "read_judgments", "read_text", "shakespeare_files"]
