"""Slimming: removing channels, heads, blocks and experts so a model is physically smaller.

``surgery`` is the one place that cuts a module's tensors and keeps its shape
attributes true; the slimming engine and ``prunereg.shrink`` both go through it.
"""
