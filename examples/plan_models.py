"""Models for `cloudtrain plan --model`: each function returns (model, batch, loss_fn).

The models are built on the meta device (no memory, no weights): the planner traces
one training step and prices it op by op on every catalog GPU.

    cloudtrain plan --model examples/plan_models.py:gpt2 --tokens 10e9 --global-batch 512
    cloudtrain plan --model examples/plan_models.py:resnet --samples 1.28e6 --epochs 90 \\
        --global-batch 256 --channels-last --explain
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpt import GPT, GPTConfig, gpt_loss
from resnet import ResNet50


def gpt2():
    """GPT-2 small (124M): 12 layers, 768 wide, 12 heads, 1024 tokens."""
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12,
                              n_embd=768))  # fmt: skip
        tokens = torch.randint(0, 50304, (2, 1024))
        targets = torch.randint(0, 50304, (2, 1024))
    return model, (tokens, targets), gpt_loss


def resnet():
    """The ResNet-50 of examples/resnet.py on 224 x 224 images, 1000 classes."""
    with torch.device("meta"):
        model = ResNet50()
        images = torch.randn(2, 3, 224, 224)
        labels = torch.randint(0, 1000, (2,))
    return model, (images, labels), lambda m, b: F.cross_entropy(m(b[0]), b[1])
