"""A small ResNet on synthetic CIFAR-shaped images (3 x 32 x 32, 10 classes).

    python examples/resnet.py --max-seconds 20
    python examples/resnet.py --device cuda --width 64 --batch 256 --steps 500

On CUDA the Trainer's defaults turn on bf16 autocast, channels_last, TF32, fused
AdamW and torch.compile. The images are random but the labels follow from them (a
fixed random linear map of a blurred copy), so the loss goes down.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from cloudtrain.runtime import FitResult, TrainConfig, Trainer


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-style network for 32x32 images: a stem, 3 stages of `depth` blocks
    (widths w, 2w, 4w; the last two halve the resolution), pooling, a linear head."""

    def __init__(self, width: int = 16, depth: int = 2, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        blocks, c = [], width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for i in range(depth):
                blocks.append(BasicBlock(c, c_out, 2 if stage > 0 and i == 0 else 1))
                c = c_out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # (B, w, 32, 32)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))  # (B, classes)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), as in ResNet-50 (stride on the 3x3)."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        )
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 for 224x224 ImageNet-shaped input: stages of 3, 4, 6, 3 bottlenecks
    (about 25.6 M parameters with 1000 classes)."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, c_in = [], 64
        for stage, (count, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
            for i in range(count):
                blocks.append(Bottleneck(c_in, width, 2 if stage > 0 and i == 0 else 1))
                c_in = 4 * width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # (B, 64, 56, 56)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))  # (B, classes)


def resnet50(classes: int = 1000) -> ResNet50:
    torch.manual_seed(0)
    return ResNet50(classes)


def synthetic_images(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=g)
    blurred = F.avg_pool2d(images, 8).flatten(1)  # (n, 48)
    labels = (blurred @ torch.randn(48, 10, generator=g)).argmax(dim=1)
    return TensorDataset(images, labels)


def classification_loss(model: nn.Module, batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images).float(), labels)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--micro", default="auto")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--precision", default="auto")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--price", type=float, default=None)
    p.add_argument("--no-store", action="store_true")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> FitResult:
    args = parse(argv)
    if args.steps is None and args.max_seconds is None:
        args.max_seconds = 30.0
    torch.manual_seed(0)
    model = ResNet(args.width, args.depth)
    # flags not given keep TrainConfig's defaults, which `cloudtrain run` sets through
    # the environment (checkpoint directory, node price)
    given = {"checkpoint_dir": args.checkpoint_dir, "price_usd_per_hour": args.price}
    config = TrainConfig(
        **{key: value for key, value in given.items() if value is not None},
        max_steps=args.steps,
        max_seconds=args.max_seconds,
        global_batch_size=args.batch,
        micro_batch_size=args.micro if args.micro == "auto" else int(args.micro),
        lr=args.lr,
        device=args.device,
        precision=args.precision,
        store=not args.no_store,
        extra={"model": "resnet"},
    )
    trainer = Trainer(model, classification_loss, synthetic_images(args.samples), config=config)
    result = trainer.fit()
    if trainer.is_main:  # under torchrun, once rather than once per rank
        print(json.dumps(result.to_dict(), indent=2) if args.json else result.summary())
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
