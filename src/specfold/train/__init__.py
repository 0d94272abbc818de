"""Training utilities for the small embedded block-diffusion LM (tokenizer first)."""
