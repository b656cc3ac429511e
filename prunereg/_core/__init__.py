"""The core: ``torch.nn.utils.prune``'s contract, re-implemented.

- :mod:`.compact`: bool mask storage, opt-in;
- :mod:`.reparam`: ``<name>_orig``, ``<name>_mask``, the forward pre-hook, ``remove``;
- :mod:`.attention`: attention modules that read a pruned tensor directly refresh it;
- :mod:`.tied`: a Parameter held by several modules is pruned everywhere, or refused;
- :mod:`.method`: ``BasePruningMethod``, ``PruningContainer``, ``apply``;
- :mod:`.custom`: ``CustomFromMask``, "apply this mask";
- :mod:`.global_pruning`: ``global_unstructured``, streamed.
"""
