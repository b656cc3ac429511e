"""Slimming: removing channels, heads and groups so that a model is physically smaller.

``engine`` (:func:`prunereg.slim`) tries ``attempt`` (one plan, cut and check)
until the slimmed model computes what its plan says. A plan runs over
``importance`` (the registry of importances) or ``masked`` (what the masks and
exact zeros remove), ``groups`` (what is removed together) and ``graph`` (the
dependency graph, over the union-find of ``ids``, from the ATen graph of one
eager forward that ``capture`` records, or from ``torch.export``); ``cut``
cuts through ``surgery``, the one place that cuts a module's tensors and keeps
its shape attributes true (``prunereg.shrink`` uses it too), and puts the
model back on a failure; ``rules`` keeps width attributes (head counts) true,
``verify`` compares the slimmed model's operations with the plan, ``widths``
sets attention modules' head counts and Hugging Face configs, ``report`` is
:class:`prunereg.SlimReport`.
"""
