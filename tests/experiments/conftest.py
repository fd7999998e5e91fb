"""Fixtures shared by the experiment tests: a tiny random Hugging Face Llama checkpoint."""

import os

import pytest

# Text the tiny tokenizer is trained on: every byte is in its alphabet (byte-level BPE), so any
# UTF-8 text, the Shakespeare plays included, encodes without unknown tokens.
TOKENIZER_TEXT = ("to be or not to be that is the question whether tis nobler in the mind to "
                  "suffer the slings and arrows of outrageous fortune\n"
                  "all the world's a stage and all the men and women merely players\n") * 4


@pytest.fixture(scope="session")
def tiny_llama_checkpoint(tmp_path_factory):
    """Directory of a random Llama (1 layer, 2 query / 1 kv heads, head dim 16, max_len 128)
    saved with ``transformers.save_pretrained``, plus a byte-level BPE ``tokenizer.json`` whose
    post-processor puts ``<s>`` before every text (as Llama's does). Skips without torch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    path = str(tmp_path_factory.mktemp("tiny_llama_bpe"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TOKENIZER_TEXT], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(os.path.join(path, "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=128, bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"))
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return path
