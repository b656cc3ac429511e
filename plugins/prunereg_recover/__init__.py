"""prunereg's recovery methods: they bring a shrunk or pruned model's outputs back towards the dense model's.

Run by :func:`prunereg.recover`. This module only names them; their classes are
imported (with torch) on first use.
"""

import prunereg

_KIND = "recovery"

_METHODS = [
    (
        "refit",
        "refit:Refit",
        "Refit each block's down_proj (o_proj too where narrowed or pruned) by least squares to the dense output",
    ),
    (
        "replace",
        "replace:Replace",
        "Fold a least-squares map for each removed span of blocks into the down_proj before it (ReplaceMe)",
    ),
    (
        "blockwise",
        "blockwise:Blockwise",
        "Train each block with Adam to match the dense block's output on the calibration tokens (block-wise KD)",
    ),
    (
        "distill",
        "distill:Distill",
        "Train the whole model on the KL divergence from the dense model's logits (logit distillation)",
    ),
]


@prunereg.hookimpl
def prunereg_register_methods(register: prunereg.Register) -> None:
    for name, target, summary in _METHODS:
        register(name, f"{__name__}.{target}", kind=_KIND, summary=summary)
