"""The networks: torchvision's ImageNet ResNets and a CIFAR-style narrow ResNet family."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import CIFAR_MODELS, TORCHVISION_MODELS


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            # Projection shortcut ("option B" of the paper): slightly more accurate than zero-padding.
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class CifarResNet(nn.Module):
    """ResNet for small images (He et al. 2016, section 4.2): depth = 6n + 2, widths w, 2w, 4w."""

    def __init__(self, depth: int, num_classes: int, in_channels: int = 3, width: int = 16) -> None:
        super().__init__()
        if (depth - 2) % 6 != 0:
            raise ValueError(f"depth must be 6n + 2, got {depth}")
        blocks_per_stage = (depth - 2) // 6
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        stages: list[nn.Module] = []
        channels = width
        for stage, out_channels in enumerate((width, 2 * width, 4 * width)):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                stages.append(BasicBlock(channels, out_channels, stride))
                channels = out_channels
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(name: str, num_classes: int, in_channels: int = 3, width: int = 16) -> nn.Module:
    if name in CIFAR_MODELS:
        return CifarResNet(int(name.removeprefix("resnet")), num_classes, in_channels, width)
    if name in TORCHVISION_MODELS:
        # Imported here: torchvision's own modules cost about 0.4 s of CPU (bench/first_report.py),
        # paid by every trial of the narrow CIFAR ResNets that never use it.
        from torchvision import models as tv_models

        model: nn.Module = getattr(tv_models, name)(weights=None, num_classes=num_classes)
        if in_channels != 3:
            # Grayscale input: a stem with fewer input channels, the rest of the network unchanged.
            stem_channels = int(model.conv1.out_channels)  # type: ignore[union-attr, arg-type]
            model.conv1 = nn.Conv2d(in_channels, stem_channels, 7, 2, 3, bias=False)
        return model
    raise ValueError(f"unknown model {name!r}")
