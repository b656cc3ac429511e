"""prunereg's shrink methods: they score MLP channels, attention heads, decoder blocks or experts for removal.

Run by :func:`prunereg.shrink` and ``prunereg shrink``. This module only names
them; their classes are imported (with torch) on first use.
"""

import prunereg

_KIND = "shrink"

_METHODS = [
    (
        "flap",
        "methods:Flap",
        "Remove channels and heads of low input fluctuation x weight norm, bias-compensated (An et al. 2024)",
    ),
    (
        "wanda_sp",
        "methods:WandaSP",
        "Remove channels and heads of low summed |weight| x input norm (Wanda, structured)",
    ),
    ("magnitude_sp", "methods:MagnitudeSP", "Remove channels and heads of low weight norm, without calibration"),
    ("block_influence", "methods:BlockInfluence", "Remove the decoder blocks that change their input least (ShortGPT)"),
    ("reap", "methods:Reap", "Remove the experts of low routed gate x output norm (REAP, Lasby et al. 2025)"),
]


@prunereg.hookimpl
def prunereg_register_methods(register: prunereg.Register) -> None:
    for name, target, summary in _METHODS:
        register(name, f"{__name__}.{target}", kind=_KIND, summary=summary)
