"""prunereg's built-in methods, registered like any third-party plugin.

This module only names the methods; their classes are imported (with torch) on
first use.
"""

import prunereg

_METHODS = [
    ("identity", "unstructured:Identity", "unstructured", "Prune nothing; sets up the reparametrization only"),
    (
        "random_unstructured",
        "unstructured:RandomUnstructured",
        "unstructured",
        "Prune a fraction of entries chosen uniformly at random",
    ),
    ("l1_unstructured", "unstructured:L1Unstructured", "unstructured", "Prune the entries of smallest absolute value"),
    (
        "random_structured",
        "structured:RandomStructured",
        "structured",
        "Prune whole channels along a dim, chosen at random",
    ),
    (
        "ln_structured",
        "structured:LnStructured",
        "structured",
        "Prune whole channels along a dim with the lowest Ln-norm",
    ),
    ("custom_from_mask", "custom:CustomFromMask", "global", "Prune where a given mask is zero"),
]


@prunereg.hookimpl
def prunereg_register_methods(register: prunereg.Register) -> None:
    for name, target, kind, summary in _METHODS:
        register(name, f"{__name__}.{target}", kind=kind, summary=summary)
