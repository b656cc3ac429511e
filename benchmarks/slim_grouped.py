"""Grouped convolutions slimmed whole or inside their groups: MACs kept, and accuracy after a short fine-tune.

    python benchmarks/slim_grouped.py            # the trained nets only (prunereg's own dependencies)
    python benchmarks/slim_grouped.py --zoo      # and torchvision's ResNeXt-50 and RegNets (needs torchvision)

docs/slimming.md's table of ``grouped="whole"`` against ``grouped="inside"``.
The trained nets: a ResNeXt-like net (three bottleneck blocks around a grouped
3x3 convolution) of 64 channels, in 32 groups of 2 or 8 groups of 8, trained
for 300 Adam steps on a synthetic task (10 noisy image templates), slimmed at
a ratio, and fine-tuned for 100 steps. One seed: the differences of a point or
two are noise.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import warnings
from pathlib import Path

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


def trained(label: str, groups: int) -> dict[str, object]:
    import prunereg

    torch.manual_seed(0)
    net = Net(64, groups)
    _train(net, 300, 0, 3e-3)
    x, y = _data(2000, 10_000)
    row: dict[str, object] = {"model": label, "dense": round(_accuracy(net, x, y), 3)}
    for ratio in (0.3, 0.5):
        for grouped in ("whole", "inside"):
            model = copy.deepcopy(net)
            report = prunereg.slim(model, x[:1], ratio=ratio, grouped=grouped)
            _train(model, 100, 20_000, 1e-3)
            row[f"{grouped}@{ratio}"] = {
                "macs_kept": round(report.macs_after / report.macs_before, 3),
                "accuracy": round(_accuracy(model, x, y), 3),
            }
    return row


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
    options = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    for label, groups in (("trained, 32 groups of 2", 32), ("trained, 8 groups of 8", 8)):
        print(json.dumps(trained(label, groups)), flush=True)
    if options.zoo:
        for name in ("resnext50_32x4d", "regnet_x_400mf", "regnet_y_400mf"):
            print(json.dumps(zoo(name)), flush=True)


if __name__ == "__main__":
    main()
