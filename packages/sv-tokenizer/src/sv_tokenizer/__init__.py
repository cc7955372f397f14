"""sv_tokenizer."""
