"""Faster Flash Decoding measured on a real model: selection quality on captured attention, the
kept fraction's power-law fit against context, passkey retrieval, planted needles, perplexity
with FFD's key storage and greedy decoding through FFD's cache (:mod:`.measure`); the decode
steps of the AOT rows (dense, FFD and QVG caches on the ``lm`` model and a Llama-3-8B shape,
:mod:`.decode_steps`)."""
