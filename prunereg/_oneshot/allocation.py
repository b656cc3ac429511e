"""OWL (Yin et al. 2024): outlier-weighted layerwise sparsity, one sparsity per decoder block.

Blocks whose Wanda scores hold more outliers (scores far above the block's mean)
matter more to the model's output, so they are pruned less. Each block's outlier
ratio is measured on the dense model, the ratios are rescaled to ``[0, 2 * lam]``,
and block i gets ``target - (r_i - mean(r))``: the average sparsity stays the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prunereg._oneshot.contract import LayerStatistics
from prunereg._oneshot.settings import OWL_LAMBDA, OWL_THRESHOLD
from prunereg._runtime.options import check_sparsity


def outlier_ratio(
    weights: Sequence[torch.Tensor], statistics: Sequence[LayerStatistics], threshold: float = OWL_THRESHOLD
) -> float:
    """Share of Wanda scores ``|W| * sqrt(input_sq_norms)`` in one decoder block above ``threshold`` * their mean.

    ``weights[i]`` (``[out, in]``) reads the input that ``statistics[i]`` describes; the
    mean is taken over the scores of all the block's layers together.
    """
    if len(weights) != len(statistics):
        raise ValueError(f"got {len(weights)} weights but {len(statistics)} statistics")
    if not weights:
        raise ValueError("outlier_ratio needs the weights of at least one layer")
    if not threshold > 0:
        raise ValueError(f"the outlier threshold must be positive, not {threshold!r}")
    scores = []
    for weight, stats in zip(weights, statistics, strict=True):
        if stats.input_sq_norms is None:
            raise ValueError("outlier_ratio needs each layer's input_sq_norms")
        norms = stats.input_sq_norms.to(device=weight.device, dtype=torch.float32).sqrt()
        scores.append(weight.detach().abs().to(torch.float32).mul_(norms).reshape(-1))
    flat = torch.cat(scores)
    limit = threshold * flat.mean(dtype=torch.float64)
    return (flat > limit).sum().item() / flat.numel()


def owl_sparsities(ratios: Sequence[float], target: float, lam: float = OWL_LAMBDA) -> list[float]:
    """Per-block sparsity: ratios rescaled to ``[0, 2 * lam]``, centred on ``target``; more outliers, less sparsity.

    Equal ratios (nothing to tell the blocks apart) give every block the target. A
    ValueError says so when a block's sparsity would leave [0, 1): lower ``lam``.
    """
    target = check_sparsity(target, "target sparsity")
    if not ratios:
        raise ValueError("owl_sparsities needs at least one block's outlier ratio")
    if not 0 <= lam < 0.5:
        raise ValueError(f"lam must be in [0, 0.5), not {lam!r}")
    low, high = min(ratios), max(ratios)
    if high == low:
        return [target] * len(ratios)
    spread = [(ratio - low) / (high - low) * 2 * lam for ratio in ratios]
    mean = sum(spread) / len(spread)
    sparsities = [target - (value - mean) for value in spread]
    if not all(0 <= s < 1 for s in sparsities):
        raise ValueError(
            f"OWL with target {target:g} and lambda {lam:g} gives sparsities from {min(sparsities):.3f} "
            f"to {max(sparsities):.3f}, outside [0, 1); lower lambda"
        )
    return sparsities
