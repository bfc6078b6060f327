"""Data: the offline GPT-2 tokenizer, dataset sources, token shards and batch loaders."""

from mars.data.tokenizer import EOT_ID, VOCAB_SIZE, get_hf_tokenizer, get_tokenizer

__all__ = ["EOT_ID", "VOCAB_SIZE", "get_hf_tokenizer", "get_tokenizer"]
