"""Pruning with a mask the caller already has: the core's method, registered here by name."""

from prunereg.toolkit import CustomFromMask

__all__ = ["CustomFromMask"]
