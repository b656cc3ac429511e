"""Model files: read, checked, pruned without the model's code, written back.

- :mod:`.errors`: the one error type of model files, and how paths are shown;
- :mod:`.dtypes`: which dtypes pruning computes with;
- :mod:`.archive_check`: zip bombs refused (:mod:`prunereg._disk.input_file` opens regular files only);
- :mod:`.checkpoint`: safetensors and torch files read (``weights_only``) and written;
- :mod:`.shared_storage`: names of a file that share one tensor;
- :mod:`.pruned_state`: a pruned state dict's ``_orig``/``_mask`` pairs as one tensor;
- :mod:`.selection`: which tensors of a file are pruned;
- :mod:`.offline`: pruning a file's tensors as torch would prune the parameters, and giving masks back.
"""
