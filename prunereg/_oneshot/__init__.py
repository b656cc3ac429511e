"""One-shot pruning of language models from calibration data, block by block.

The blocks run on the runtime (:mod:`prunereg._runtime`): calibration ids,
capture, statistics, block weights in memory or streamed. What is one-shot
pruning's own:

- :mod:`.contract`: what a calibrated method receives and returns;
- :mod:`.settings`: its settings, spelled once (no torch);
- :mod:`.allocation`: OWL's per-block sparsities;
- :mod:`.report`, :mod:`.perplexity`: what a run did, and what it cost;
- :mod:`.engine`: ``prunereg.oneshot``;
- :mod:`.folder`: a safetensors folder pruned one block at a time;
- :mod:`.conformance`: the check for calibrated methods (``prunereg.testing``).
"""
