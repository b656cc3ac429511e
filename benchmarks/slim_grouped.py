"""Grouped convolutions slimmed whole or inside their groups: MACs kept, and accuracy after a short fine-tune.

    python benchmarks/slim_grouped.py            # the trained nets only (prunereg's own dependencies)
    python benchmarks/slim_grouped.py --seeds 2  # fewer seeds (default 5)
    python benchmarks/slim_grouped.py --zoo      # and torchvision's ResNeXt-50 and RegNets (needs torchvision)

docs/slimming.md's table of ``grouped="whole"`` against ``grouped="inside"``.
The trained nets: a ResNeXt-like net (three bottleneck blocks around a grouped
3x3 convolution) of 64 channels, in 32 groups of 2 or 8 groups of 8, trained
for 300 Adam steps on a synthetic task (10 noisy image templates), slimmed at
ratios 0.3, 0.5 and 0.7, and fine-tuned for 100 steps; the dense net trained
for the same 100 steps more is the baseline. Each seed draws the net's
initial weights and its training batches. The two ways remove different MACs
at a ratio, so each way's accuracy is also read at the other's MACs (linear
between its own ratios): the comparison at an equal cost.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TEMPLATES = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    return TEMPLATES[labels] + 3.0 * torch.randn(n, 3, 16, 16, generator=generator), labels


def _conv_bn(cin: int, cout: int, kernel: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, padding=kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)
    )


class Block(nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.a, self.b = _conv_bn(channels, channels), _conv_bn(channels, channels, 3, groups)
        self.c = _conv_bn(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.c(F.relu(self.b(F.relu(self.a(x))))))


class Net(nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.stem = _conv_bn(3, channels, 3)
        self.blocks = nn.Sequential(*[Block(channels, groups) for _ in range(3)])
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(F.relu(self.stem(x))).mean((2, 3)))


def _train(model: nn.Module, steps: int, first_seed: int, rate: float) -> None:
    optimizer = torch.optim.Adam(model.parameters(), rate)
    model.train()
    for step in range(steps):
        x, y = _data(64, first_seed + step)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


RATIOS = (0.3, 0.5, 0.7)
WAYS = ("whole", "inside")


def trained(label: str, groups: int, seed: int) -> dict[str, object]:
    """One seed of one net: the dense accuracy, and MACs kept and accuracy per way and ratio."""
    import prunereg

    torch.manual_seed(seed)
    net = Net(64, groups)
    _train(net, 300, seed * 100_000, 3e-3)
    x, y = _data(2000, 10_000)
    dense = copy.deepcopy(net)
    _train(dense, 100, seed * 100_000 + 20_000, 1e-3)
    row: dict[str, object] = {"model": label, "seed": seed, "dense": round(_accuracy(dense, x, y), 3)}
    for ratio in RATIOS:
        for grouped in WAYS:
            model = copy.deepcopy(net)
            report = prunereg.slim(model, x[:1], ratio=ratio, grouped=grouped)
            _train(model, 100, seed * 100_000 + 20_000, 1e-3)
            row[f"{grouped}@{ratio}"] = {
                "macs_kept": round(report.macs_after / report.macs_before, 3),
                "accuracy": round(_accuracy(model, x, y), 3),
            }
    return row


def _curve(rows: list[dict[str, Any]], way: str) -> list[tuple[float, float]]:
    """(mean MACs kept, mean accuracy) per ratio over the seeds, fewest MACs first."""
    points = [
        (statistics.mean(r[f"{way}@{ratio}"]["macs_kept"] for r in rows),
         statistics.mean(r[f"{way}@{ratio}"]["accuracy"] for r in rows))
        for ratio in RATIOS
    ]  # fmt: skip
    return sorted(points)


def at_macs(curve: list[tuple[float, float]], macs: float) -> float | None:
    """The accuracy ``curve`` reads at ``macs`` kept, linear between its points; ``None`` outside them."""
    for (m0, a0), (m1, a1) in itertools.pairwise(curve):
        if m0 <= macs <= m1:
            return a0 if m1 == m0 else a0 + (a1 - a0) * (macs - m0) / (m1 - m0)
    return None


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: per ratio and way, MACs kept, accuracy (mean and spread over seeds), the other way there."""
    curves = {way: _curve(rows, way) for way in WAYS}
    lines = [
        f"dense, 100 more steps: {statistics.mean(r['dense'] for r in rows):.1%} over {len(rows)} seeds",
        "",
        "| ratio | way | MACs kept | accuracy (mean, min-max) | the other way at these MACs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for ratio in RATIOS:
        for way in WAYS:
            macs = statistics.mean(r[f"{way}@{ratio}"]["macs_kept"] for r in rows)
            accuracy = [r[f"{way}@{ratio}"]["accuracy"] for r in rows]
            other = at_macs(curves[WAYS[1 - WAYS.index(way)]], macs)
            lines.append(
                f"| {ratio} | {way} | {macs:.1%} | {statistics.mean(accuracy):.1%} ({min(accuracy):.1%}-"
                f"{max(accuracy):.1%}) | {'-' if other is None else f'{other:.1%}'} |"
            )
    return lines


def zoo(name: str) -> dict[str, object]:
    import prunereg
    from benchmarks.slim_zoo import ZOO

    torch.manual_seed(0)
    dense, inputs = ZOO[name]()
    row: dict[str, object] = {"model": name}
    for grouped in ("whole", "inside"):
        report = prunereg.slim(copy.deepcopy(dense), inputs, ratio=0.5, grouped=grouped)
        row[f"{grouped}@0.5"] = {"macs_kept": round(report.macs_after / report.macs_before, 3)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="store_true", help="also torchvision's ResNeXt-50 and RegNets (torchvision)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per trained net (default 5)")
    options = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    for label, groups in (("trained, 32 groups of 2", 32), ("trained, 8 groups of 8", 8)):
        rows = []
        for seed in range(options.seeds):
            rows.append(trained(label, groups, seed))
            print(json.dumps(rows[-1]), flush=True)
        print("\n".join([f"\n{label}:", *summary(rows), ""]), flush=True)
    if options.zoo:
        for name in ("resnext50_32x4d", "regnet_x_400mf", "regnet_y_400mf"):
            print(json.dumps(zoo(name)), flush=True)


if __name__ == "__main__":
    main()
