"""Whole pruned models: state dicts, summaries, Hugging Face folders."""
