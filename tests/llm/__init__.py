"""One-shot pruning of language models: the calibrated contract, the engine, its methods, streaming, perplexity."""
