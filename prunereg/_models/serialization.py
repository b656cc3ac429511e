"""Loading whole pruned models with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from prunereg import _legacy


@contextlib.contextmanager
def safe_globals(*classes: type) -> Iterator[None]:
    """Allow prunereg's method classes (and ``classes``) in ``torch.load(weights_only=True)``.

    A pruned module pickles its pruning hooks; the weights-only unpickler refuses
    any class it has not been told is safe. Within this block it accepts every
    registered pruning method, ``PruningContainer``, the attention refresh hook, and the module classes you
    name (your model's own ``nn.Module`` classes)::

        with prunereg.safe_globals(nn.Sequential, nn.Linear):
            model = torch.load("pruned.pt", weights_only=True)

    Method classes are plain data (their attributes are numbers, strings and
    tensors); nothing they define runs while unpickling.
    """
    allowed = _method_classes()
    # A model pickled by prunereg 0.1 names some of these classes by their old module paths.
    renamed = [(cls, name) for cls in allowed for name in _legacy.old_names(cls)]
    with torch.serialization.safe_globals([*allowed, *renamed, *classes]):
        yield


def _method_classes() -> list[type]:
    from prunereg._core.attention import RefreshPruned
    from prunereg._core.method import PruningContainer
    from prunereg._plugins.loading import registry

    found: list[type] = [PruningContainer, RefreshPruned]
    reg = registry()
    for name in reg.names():
        with contextlib.suppress(Exception):  # an unimportable plugin is reported by the registry
            found.append(reg.resolve(name))
    return found
