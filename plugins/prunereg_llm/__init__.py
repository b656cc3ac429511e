"""prunereg's calibrated methods for language models: Wanda, SparseGPT and a magnitude baseline.

They prune the Linear layers of a decoder block from calibration statistics, run
by :func:`prunereg.oneshot`. This module only names them; their classes are
imported (with torch) on first use.
"""

import prunereg

_KIND = "calibrated"

_METHODS = [
    (
        "wanda",
        "wanda:Wanda",
        "Prune the lowest |weight| * input norm in each row, or N of every M inputs (Sun et al. 2023)",
    ),
    (
        "sparsegpt",
        "sparsegpt:SparseGPT",
        "Prune by the OBS saliency and update the kept weights (Frantar and Alistarh 2023)",
    ),
    ("magnitude", "magnitude:Magnitude", "Prune the smallest |weight| per row or per matrix, without calibration"),
]


@prunereg.hookimpl
def prunereg_register_methods(register: prunereg.Register) -> None:
    for name, target, summary in _METHODS:
        register(name, f"{__name__}.{target}", kind=_KIND, summary=summary)
