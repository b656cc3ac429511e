"""Model files: reading, checking and pruning them without the model's code."""
