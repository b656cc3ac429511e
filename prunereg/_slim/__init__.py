"""Slimming: removing channels, heads and groups so that a model is physically smaller.

``engine`` (:func:`prunereg.slim`) plans over ``importance`` (the registry of
importances), ``groups`` (what is removed together) and ``graph`` (the
dependency graph from ``torch.export``, over the union-find of ``ids``), then
cuts through ``surgery``, the one place that cuts a module's tensors and keeps
its shape attributes true (``prunereg.shrink`` uses it too); ``widths`` sets
attention modules' head counts and Hugging Face configs, ``report`` is
:class:`prunereg.SlimReport`.
"""
