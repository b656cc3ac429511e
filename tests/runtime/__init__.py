"""The block-by-block runtime: statistics and their recorder, capture, parts, streaming."""
