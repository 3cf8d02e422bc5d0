"""What is trained: a `Workload` (model shape, data amount, batch, precision, optimizer)
and its training FLOPs.

FLOPs per token of a transformer (PaLM, Chowdhery et al. 2022, appendix B):

    6·N + 12·L·H·Q·T

N = parameters doing matmuls (the input-embedding lookup table is not a matmul and is
left out, as torchtitan does), L layers, H heads, Q head size (H·Q = hidden size), T
sequence length. 6N is 2N for the forward and 4N for the backward; 12·L·H·Q·T is the
attention scores and their weighted sum. Full activation recomputation runs the forward
again: 8·N + 16·L·H·Q·T. A model that is not a transformer gives its forward FLOPs per
sample; training is 3x that (4x with recomputation).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cloudtrain.errors import UnknownNameError, UserError
from cloudtrain.plan.profile import ModelProfile

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
OPTIMIZERS = ("adamw", "adam", "sgd", "lion", "adafactor", "adamw8bit")
OPTIMIZER_IMPLS = ("foreach", "fused", "plain")
SHARDINGS = ("ddp", "fsdp")
DATA_KINDS = ("tokens", "images", "other")


@dataclass(frozen=True)
class Workload:
    """One training job. Transformers give `layers`, `hidden_size`, `heads` and `seq_len`;
    other models give `forward_flops_per_sample` (and `activation_bytes_per_sample`);
    a traced model gives its `profile` (FLOPs, bytes and activation memory per op).

    The amount of data is `tokens` (transformers), else `samples_per_epoch` x `epochs`.
    """

    name: str
    parameters: float
    """Total trainable parameters (weights, gradients and optimizer states scale with it)."""
    global_batch: int
    """Samples (sequences, images) per optimizer step across all GPUs."""
    layers: int | None = None
    hidden_size: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    """Tokens per sample; None for a model that is not a transformer."""
    vocab_size: int | None = None
    """Output vocabulary; None: the logits' memory is left out."""
    embedding_parameters: float = 0.0
    """Parameters of the input-embedding lookup (left out of 6N: no matmul)."""
    forward_flops_per_sample: float | None = None
    """Forward FLOPs of one sample (multiply and add counted apart); None for transformers,
    whose FLOPs come from the PaLM formula."""
    activation_bytes_per_sample: float | None = None
    """Activation memory of one sample at 16-bit precision, for non-transformers; None:
    transformers use Korthikanti et al. 2022."""
    tokens: float | None = None
    """Tokens to train on in total; None: `samples_per_epoch` x `epochs` is used."""
    samples_per_epoch: float | None = None
    epochs: float = 1.0
    precision: str = "bf16"
    optimizer: str = "adamw"
    activation_checkpointing: bool | None = None
    """True/False forces full recomputation on/off; None: decided from memory."""
    sharding: str | None = None
    """'ddp' or 'fsdp'; None: DDP when it fits, else FSDP."""
    flash_attention: bool = True
    """Fused attention (no s x s score matrix kept); False keeps Korthikanti's 5as/h term."""
    data_kind: str = "tokens"
    """'tokens' (pre-tokenized text), 'images' (decoded and augmented on CPU) or 'other'."""
    source: str = ""
    """Where the shape and size come from (presets cite their paper)."""
    profile: ModelProfile | None = field(default=None, repr=False, compare=False)
    """The traced training step (`cloudtrain.profile_model`); when given, step time is a
    roofline over its ops and activation memory is the traced peak."""
    compile: bool = False
    """Trained under `torch.compile` (fuses elementwise chains; see plan/roofline.py)."""
    optimizer_impl: str = "foreach"
    """'foreach' (PyTorch's default on GPUs), 'fused' or 'plain' (a for-loop)."""
    micro_batch: int | None = None
    """Samples per GPU per forward; None: the largest that fits."""
    tf32: bool | None = None
    """fp32 matmuls and convolutions in TF32 (True), in full fp32 (False), or as PyTorch
    does by default for the precision (None: see plan/roofline.py)."""

    def __post_init__(self) -> None:
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("data kind", self.data_kind, DATA_KINDS)
        _check_choice("optimizer implementation", self.optimizer_impl, OPTIMIZER_IMPLS)
        if self.micro_batch is not None and self.micro_batch < 1:
            raise UserError(f"workload '{self.name}': micro_batch must be at least 1")
        if self.sharding is not None:
            _check_choice("sharding", self.sharding, SHARDINGS)
        if self.parameters <= 0 or self.global_batch < 1:
            raise UserError(f"workload '{self.name}': parameters and global_batch must be positive")
        traced = self.profile is not None
        if not self.is_transformer and self.forward_flops_per_sample is None and not traced:
            raise UserError(
                f"workload '{self.name}': give layers, hidden_size, heads and seq_len "
                "(transformer) or forward_flops_per_sample (other models)"
            )
        if self.tokens is None and self.samples_per_epoch is None:
            raise UserError(
                f"workload '{self.name}': give tokens or samples_per_epoch (with epochs)"
            )
        if self.tokens is not None and self.seq_len is None:
            raise UserError(f"workload '{self.name}': tokens need seq_len (tokens per sample)")

    @property
    def is_transformer(self) -> bool:
        return None not in (self.layers, self.hidden_size, self.heads, self.seq_len)

    @property
    def total_samples(self) -> float:
        """Samples over the whole run."""
        if self.tokens is not None:
            return self.tokens / float(self.seq_len or 1)
        return float(self.samples_per_epoch or 0.0) * self.epochs

    @property
    def total_tokens(self) -> float | None:
        """Tokens over the whole run; None for models without a sequence length."""
        if self.seq_len is None:
            return None
        return self.total_samples * self.seq_len

    def replace(self, **changes: Any) -> Workload:
        """A copy with fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _check_choice(kind: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UnknownNameError(kind, value, choices)


def model_flops_per_sample(workload: Workload) -> float:
    """Training FLOPs of one sample without recomputation (what MFU counts)."""
    if workload.profile is not None:
        return workload.profile.flops_per_sample()
    if workload.is_transformer:
        return flops_per_token(workload) * float(workload.seq_len or 0)
    return 3.0 * float(workload.forward_flops_per_sample or 0.0)


def flops_per_token(workload: Workload, *, recompute: bool = False) -> float:
    """6·N + 12·L·H·Q·T (PaLM appendix B); 8·N + 16·L·H·Q·T with full recomputation."""
    if not workload.is_transformer:
        raise ValueError(f"workload '{workload.name}' is not a transformer")
    matmul_params = workload.parameters - workload.embedding_parameters
    attention = float(workload.layers * workload.hidden_size * workload.seq_len)  # type: ignore[operator]
    factor = 4.0 / 3.0 if recompute else 1.0
    return factor * (6.0 * matmul_params + 12.0 * attention)


def hardware_flops_per_sample(workload: Workload, *, recompute: bool) -> float:
    """FLOPs the GPUs execute per sample: model FLOPs, plus one more forward when the
    activations are recomputed (a forward is a third of training FLOPs)."""
    model = model_flops_per_sample(workload)
    return model * 4.0 / 3.0 if recompute else model


def training_flops(workload: Workload) -> float:
    """Model FLOPs of the whole run (no recomputation)."""
    return model_flops_per_sample(workload) * workload.total_samples


def steps_for(workload: Workload, effective_global_batch: int) -> int:
    """Optimizer steps to go through the data once at the given batch."""
    return max(1, math.ceil(workload.total_samples / effective_global_batch))


def traced_workload(
    profile: ModelProfile,
    *,
    global_batch: int,
    tokens: float | None = None,
    samples_per_epoch: float | None = None,
    epochs: float = 1.0,
    **changes: Any,
) -> Workload:
    """A workload for a traced model: its parameters, FLOPs and memory come from the
    profile; `changes` sets the other Workload fields (optimizer, compile, ...)."""
    if tokens is None and samples_per_epoch is None:
        raise UserError(
            f"model '{profile.name}': give the data amount (--tokens or --samples [--epochs])"
        )
    if tokens is not None and profile.tokens_per_sample is None:
        raise UserError(
            f"model '{profile.name}': --tokens needs token-id batches (B, T); give --samples"
        )
    kind = "tokens" if profile.tokens_per_sample else (
        "images" if len(profile.sample_shape) == 3 else "other"
    )  # fmt: skip
    return Workload(
        name=profile.name,
        parameters=float(profile.parameters),
        global_batch=global_batch,
        seq_len=profile.tokens_per_sample,
        tokens=tokens,
        samples_per_epoch=samples_per_epoch,
        epochs=epochs,
        precision=profile.precision,
        data_kind=kind,
        profile=profile,
        source=f"traced ({profile.traced_on}), fingerprint {profile.fingerprint}",
        **changes,
    )
