"""One-shot pruning of language models from calibration data, block by block.

- :mod:`.contract`, :mod:`.precision`: what a calibrated method receives and returns; matmul precision;
- :mod:`.calibration`: texts, tokenizer output, datasets and text files as token ids, read no further than used;
- :mod:`.blocks`: where each architecture keeps its decoder blocks, and which layers prune;
- :mod:`.capture`: the first block's inputs, and running a block on them;
- :mod:`.statistics`: per-input-group statistics (norms, Hessians);
- :mod:`.allocation`: OWL's per-block sparsities;
- :mod:`.report`, :mod:`.perplexity`: what a run did, and what it cost;
- :mod:`.engine`: ``prunereg.oneshot``;
- :mod:`.streaming`: a safetensors folder pruned one block at a time;
- :mod:`.conformance`: the check for calibrated methods (``prunereg.testing``).
"""
