"""Shrinking language models: calibrated removal of MLP channels, attention heads, decoder blocks and experts.

``prunereg.shrink`` (:mod:`prunereg._shrink.engine`) runs the blocks on the
runtime (:mod:`prunereg._runtime`), scores the parts of a model with a method
of kind ``shrink`` (:mod:`prunereg._shrink.contract`), removes the lowest
through :mod:`prunereg._shrink.removal` and rewrites the config so that stock
``transformers`` reloads the smaller model.
"""
