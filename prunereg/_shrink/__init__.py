"""Shrinking language models: calibrated removal of MLP channels, attention heads, decoder blocks and experts.

``prunereg.shrink`` (:mod:`prunereg._shrink.engine`) scores the parts of a model
with a method of kind ``shrink`` (:mod:`prunereg._shrink.contract`), removes the
lowest through :mod:`prunereg._slim.surgery` and rewrites the config so that
stock ``transformers`` reloads the smaller model.
"""
