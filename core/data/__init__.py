"""Data: text corpora, the byte-level tokenizer, checkpointable batch iterators, and readers of
pairwise-judgement files."""

from core.data.judgments import Judgments, read_judgments
from core.data.text import (
    ByteTokenizer,
    Corpus,
    TextBatcher,
    load_corpus,
    shakespeare_files,
)

__all__ = ["ByteTokenizer", "Corpus", "Judgments", "TextBatcher", "load_corpus", "read_judgments",
           "shakespeare_files"]
