"""Data: text corpora, the byte-level tokenizer and checkpointable batch iterators."""

from core.data.text import (
    ByteTokenizer,
    Corpus,
    TextBatcher,
    load_corpus,
    shakespeare_files,
)

__all__ = ["ByteTokenizer", "Corpus", "TextBatcher", "load_corpus", "shakespeare_files"]
