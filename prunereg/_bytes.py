"""A CPU tensor's bytes as a buffer, without numpy: torch does not depend on it, and a clean install lacks it."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def tensor_buffer(tensor: Tensor) -> memoryview:
    """The bytes of ``tensor`` (copied to a contiguous CPU tensor first where it is not one), not copied again.

    The buffer keeps that tensor alive as long as it is referenced, so a
    temporary may be passed.
    """
    data = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous()
    size = data.numel() * data.element_size()
    if size == 0:
        return memoryview(b"")
    window = (ctypes.c_char * size).from_address(data.data_ptr())
    window.tensor = data  # type: ignore[attr-defined]  # the buffer's owner: freed only with it
    return memoryview(window).cast("B")
