"""Helpers the tests share: inputs, tiny models, fake plugins, torch's reference masks, workers."""
