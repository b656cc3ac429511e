"""prunereg.testing.check_calibrated_method passes the built-in methods and names what a broken one breaks."""

from __future__ import annotations

import pytest
import torch

from prunereg import CalibratedMethod, PrunedWeight
from prunereg.testing import check_calibrated_method


@pytest.mark.parametrize(
    ("name", "options"), [("wanda", {}), ("sparsegpt", {}), ("sparsegpt", {"blocksize": 4}), ("magnitude", {}),
                          ("magnitude", {"scope": "matrix"})]
)  # fmt: skip
def test_the_built_in_methods_keep_the_contract(name, options):
    check_calibrated_method(name, **options)


class _RowMagnitude(CalibratedMethod):
    """A correct method that the broken ones below change in one way each."""

    def prune_group(self, weights, statistics, sparsities):
        results = []
        for weight, sparsity in zip(weights, sparsities, strict=True):
            mask = torch.ones_like(weight, dtype=torch.bool)
            if self.n_m is not None:
                n, m = self.n_m
                groups = weight.abs().reshape(weight.shape[0], -1, m)
                lowest = groups.argsort(dim=-1)[..., :n]
                mask = mask.reshape(groups.shape).scatter(-1, lowest, False).reshape(weight.shape)
            else:
                k = int(weight.shape[1] * sparsity)
                mask.scatter_(1, weight.abs().argsort(dim=1)[:, :k], False)
            results.append(PrunedWeight(weight * mask, mask))
        return results


class _ChangesItsInput(_RowMagnitude):
    def prune_group(self, weights, statistics, sparsities):
        results = super().prune_group(weights, statistics, sparsities)
        weights[0].mul_(0)
        return results


class _FloatMask(_RowMagnitude):
    def prune_group(self, weights, statistics, sparsities):
        return [PrunedWeight(w, m.float()) for w, m in super().prune_group(weights, statistics, sparsities)]


class _OneSparsityForAll(_RowMagnitude):
    def prune_group(self, weights, statistics, sparsities):
        return super().prune_group(weights, statistics, [sparsities[0]] * len(weights))


class _IgnoresThePattern(_RowMagnitude):
    def prune_group(self, weights, statistics, sparsities):
        self.n_m = None
        return super().prune_group(weights, statistics, sparsities)


class _ForgetsToZero(_RowMagnitude):
    def prune_group(self, weights, statistics, sparsities):
        return [
            PrunedWeight(w.clone(), m)
            for w, (_, m) in zip(weights, super().prune_group(weights, statistics, sparsities), strict=True)
        ]


class _UpdatesSecretly(_RowMagnitude):
    def prune_group(self, weights, statistics, sparsities):
        return [PrunedWeight(w * 2, m) for w, m in super().prune_group(weights, statistics, sparsities)]


class _NoChecks(_RowMagnitude):
    def __init__(self, sparsity=0.5, pattern=None):
        self.sparsity, self.pattern, self.n_m = sparsity, pattern, (2, 4) if pattern else None


def test_a_correct_method_passes():
    check_calibrated_method(_RowMagnitude)


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (_ChangesItsInput, "changed the weights it was given"),
        (_FloatMask, "a mask must be bool"),
        (_OneSparsityForAll, "target sparsity 0.25 was pruned to 0.500"),
        (_IgnoresThePattern, "exactly 2 pruned"),
        (_ForgetsToZero, "not zero everywhere its mask is False"),
        (_UpdatesSecretly, "UPDATES_WEIGHTS is False"),
        (_NoChecks, "sparsity=1.0 was accepted"),
        (torch.nn.Linear, "not a prunereg.CalibratedMethod subclass"),
        ("l1_unstructured", "registered as kind 'unstructured'"),
    ],
)
def test_a_broken_method_fails_naming_the_check(method, message):
    with pytest.raises(AssertionError, match=message):
        check_calibrated_method(method)
