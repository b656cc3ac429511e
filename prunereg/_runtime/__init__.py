"""Running a causal language model's decoder blocks one at a time over calibration data.

What every block-by-block engine (one-shot pruning, shrinking, recovery) shares:

- :mod:`.calibration`: texts, tokenizer output, datasets and text files as token ids; ids the model cannot read refused;
- :mod:`.blocks`, :mod:`.parts`: where each architecture keeps its decoder blocks, their Linear layers, and the
  parts of a block (MLP channels, attention heads, experts, their writer projections);
- :mod:`.capture`: the first block's inputs, running a block on them and advancing them past it;
- :mod:`.mode`, :mod:`.precision`: the run's eval mode without autograd, its input device, its matmul precision;
- :mod:`.weights`, :mod:`.streamed`: where the blocks' weights are: in memory, or streamed from a model folder;
- :mod:`.recorder`: the statistics of calibration activations, gathered by forward hooks;
- :mod:`.journal`: what a run replaced, to put back on failure;
- :mod:`.options`: the base of every engine's settings (no torch);
- :mod:`.conformance`: what the engines' conformance checks share.
"""
