"""Whole pruned models: state dicts, whole-model pickles, summaries, Hugging Face folders.

- :mod:`.state_dict`: pruned and unpruned state dicts, both ways;
- :mod:`.serialization`: ``torch.load(weights_only=True)`` of a whole pruned model;
- :mod:`.summary`: each parameter's sparsity and the methods that pruned it;
- :mod:`.grouping`: a summary's rows per block or per tensor type; :mod:`.table`: how the tables look;
- :mod:`.huggingface`: ``save_pretrained``/``from_pretrained`` that keep values and masks.
"""
