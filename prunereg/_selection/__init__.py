"""Selection on plain tensors: which entries or channels a method prunes.

- :mod:`.radix`: the radix-select engine (the k-th score without sorting);
- :mod:`.scopes`: the lowest scores per row, per N:M group or overall (what calibrated methods prune);
- :mod:`.select`: the policy every method shares (``select_k``, ``prune_lowest``, one ``uses_topk`` rule,
  one NaN rule: ``nan_lowest``);
- :mod:`.remaining`: a new method's mask on what earlier pruning left;
- :mod:`.channels`: masks of whole channels;
- :mod:`.amount`: torch's rules for ``amount`` and ``dim``;
- :mod:`.threads`: how many threads the radix select's operations run on.

DTensors reach these through :mod:`prunereg._distributed`.
"""
