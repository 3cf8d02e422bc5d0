"""cloudtrain.profiling: a traced training step against hand-computed FLOPs, bytes and
GEMM shapes, the device paths, autocast emulation, activation memory, the cache."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cloudtrain.errors import UserError
from cloudtrain.plan.profile import ModelProfile
from cloudtrain.profiling import api, fingerprint_model, op_class_of, profile_model


def ops_of(profile: ModelProfile, *, op=None, phase=None, op_class=None):
    return [
        o
        for o in profile.ops
        if (op is None or o.op == op)
        and (phase is None or o.phase == phase)
        and (op_class is None or o.op_class == op_class)
    ]


def flops_of(ops, batch: float) -> float:
    return sum(o.flops.at(batch) * o.count for o in ops)


def trace(model, batch, loss_fn=None, **kwargs) -> ModelProfile:
    kwargs.setdefault("precision", "fp32")
    kwargs.setdefault("cache", False)
    return profile_model(model, batch, loss_fn, **kwargs)


# -- models ---------------------------------------------------------------------------


class Block(nn.Module):
    """A GPT block: pre-norm causal self-attention through SDPA, then a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 96, dim: int = 32, heads: int = 4, t: int = 16) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(t, dim)
        self.block, self.ln = Block(dim, heads), nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        logits = self.head(self.ln(self.block(self.wte(ids) + self.wpe(pos))))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt_batch(b: int = 2, t: int = 16, vocab: int = 96):
    ids = torch.randint(0, vocab, (b, t))
    return ids, torch.randint(0, vocab, (b, t))


def mlp(width: int = 128, depth: int = 12, out: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, out))


@torch.library.custom_op("cloudtrain_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


double.register_autograd(lambda ctx, grad: grad * 2)


# -- hand-computed costs ----------------------------------------------------------------


def test_linear_step_flops_bytes_and_gemm_by_hand():
    profile = trace(nn.Linear(64, 32), torch.randn(4, 64))
    assert profile.traced_on == "meta"
    (fwd,) = ops_of(profile, phase="forward", op_class="matmul")
    assert fwd.op == "aten.addmm" and fwd.dtype == "fp32"
    assert fwd.flops.fixed == 0 and fwd.flops.per_sample == 2 * 64 * 32
    m, n, k = fwd.gemm
    assert (m.fixed, m.per_sample, n.at(7), k.at(7)) == (0, 1, 32, 64)
    # Weights and bias are read once whatever the batch; input and output per sample.
    assert fwd.bytes.fixed == (64 * 32 + 32) * 4
    assert fwd.bytes.per_sample == (64 + 32) * 4
    # Backward: the weight gradient only (the batch needs no gradient).
    (bwd,) = ops_of(profile, phase="backward", op_class="matmul")
    assert bwd.flops.per_sample == 2 * 64 * 32
    assert sorted(d.at(1) for d in bwd.gemm) == [1, 32, 64]
    assert profile.parameters == 64 * 32 + 32 and profile.parameter_tensors == 2
    assert profile.sample_shape == (64,) and profile.tokens_per_sample is None
    assert not any(o.op in ("aten.t", "aten.view", "aten.detach") for o in profile.ops)


def test_backward_matmuls_are_twice_the_forward_for_an_inner_layer():
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
    profile = trace(model, torch.randn(3, 16))
    forward = flops_of(ops_of(profile, phase="forward", op_class="matmul"), 1)
    backward = flops_of(ops_of(profile, phase="backward", op_class="matmul"), 1)
    assert forward == 2 * 16 * 64 + 2 * 64 * 32
    # grad W1; grad input and grad weight of the second layer: 2x its forward.
    assert backward == 2 * 16 * 64 + 2 * (2 * 64 * 32)


def test_convolutions_dense_and_depthwise():
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, groups=8))
    profile = trace(model, torch.randn(2, 4, 10, 10))
    dense, depthwise = ops_of(profile, op="aten.convolution", phase="forward")
    assert dense.flops.per_sample == 2 * 8 * 10 * 10 * 4 * 3 * 3
    assert depthwise.flops.per_sample == 2 * 8 * 10 * 10 * (8 // 8) * 3 * 3
    assert (dense.groups, depthwise.groups) == (1, 8)
    assert [d.at(2) for d in dense.gemm] == [2 * 10 * 10, 8, 4 * 9]
    assert [d.at(2) for d in depthwise.gemm] == [2 * 10 * 10, 1, 9]
    assert dense.op_class == depthwise.op_class == "convolution"
    backward = ops_of(profile, op="aten.convolution_backward")
    assert len(backward) == 2 and all(o.phase == "backward" for o in backward)
    by_groups = {o.groups: o for o in backward}
    # The first conv's input needs no gradient: its backward is the weight gradient only.
    assert by_groups[1].flops.per_sample == dense.flops.per_sample
    assert by_groups[8].flops.per_sample == 2 * depthwise.flops.per_sample
    assert by_groups[8].gemm == depthwise.gemm
    assert not any(o.channels_last for o in profile.ops)


def test_channels_last_convolutions_are_marked():
    model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    profile = trace(model, torch.randn(2, 4, 12, 12), channels_last=True)
    convs = ops_of(profile, op_class="convolution")
    assert convs and all(o.channels_last for o in convs)
    assert profile.channels_last


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_lstm_forward_flops_match_the_formula(device):
    inputs, hidden, steps = 32, 128, 6
    model = nn.LSTM(inputs, hidden, batch_first=True)
    profile = trace(model, torch.randn(2, steps, inputs), device=device)
    expected = 2 * 4 * (inputs + hidden) * hidden * steps
    assert profile.forward_flops_per_sample() == pytest.approx(expected, rel=0.05)
    assert flops_of(ops_of(profile, phase="backward"), 1) > 1.9 * expected
    if device == "cpu":  # one fused RNN op, the case FlopCounterMode misses
        assert profile.traced_on == "cpu"
        (rnn,) = ops_of(profile, phase="forward", op_class="matmul")
        assert rnn.op == "aten.mkldnn_rnn_layer" and rnn.flops.per_sample == expected


@pytest.mark.parametrize(
    ("precision", "device", "kernel"),
    [
        ("bf16", "auto", "aten._scaled_dot_product_flash_attention"),
        ("fp32", "auto", "aten._scaled_dot_product_efficient_attention"),
        ("fp32", "cpu", "aten._scaled_dot_product_flash_attention_for_cpu"),
    ],
)
def test_gpt_block_attention_ops(precision, device, kernel):
    t, heads, dim = 16, 4, 32
    profile = trace(TinyGPT(t=t), gpt_batch(t=t), precision=precision, device=device)
    (fwd,) = ops_of(profile, op=kernel)
    (bwd,) = ops_of(profile, op=f"{kernel}_backward")
    assert fwd.op_class == bwd.op_class == "attention" and bwd.phase == "backward"
    assert fwd.groups == 2 * heads  # batch x heads, at the traced batch 2
    assert [d.at(1) for d in fwd.gemm] == [t, t, dim // heads]
    assert fwd.flops.per_sample == 4 * heads * t * t * (dim // heads)
    assert bwd.flops.per_sample == pytest.approx(2.5 * fwd.flops.per_sample)
    assert profile.tokens_per_sample == t and profile.sample_shape == (t,)
    assert profile.notes == ()
    assert not ops_of(profile, op="aten._safe_softmax")  # no unfused math path


def test_bf16_autocast_emulation_marks_matmuls_and_their_outputs():
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 32))
    profile = trace(model, torch.randn(4, 64), precision="bf16")
    matmuls = ops_of(profile, op_class="matmul")
    assert len(matmuls) >= 5 and all(o.dtype == "bf16" for o in matmuls)
    (gelu,) = ops_of(profile, op="aten.gelu")
    assert gelu.dtype == "bf16" and gelu.bytes.per_sample == 2 * 128 * 2  # in + out, 2 B each
    # CUDA autocast runs layer_norm in fp32: its input is cast up, its output is fp32.
    (norm,) = ops_of(profile, op="aten.native_layer_norm")
    assert norm.dtype == "fp32"
    casts = ops_of(profile, op="aten._to_copy", phase="forward")
    weight_casts = [o for o in casts if o.bytes.per_sample == 0]
    assert len(weight_casts) == 4  # two weights and two biases, cast once each
    assert profile.extra["autocast"].startswith("emulated")


def test_mha_composite_is_cast_inside():
    model = nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 8, 32)
    profile = trace(model, (x, x, x), lambda m, b: m(*b, need_weights=False)[0].float().mean(),
                    precision="bf16")  # fmt: skip
    matmuls = ops_of(profile, op_class="matmul", phase="forward")
    assert matmuls and all(o.dtype == "bf16" for o in matmuls)
    assert ops_of(profile, op="aten._scaled_dot_product_flash_attention")


def test_meta_built_model_traces_like_a_cpu_model():
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(24, 48), nn.LayerNorm(48), nn.GELU(), nn.Linear(48, 5))

    with torch.device("meta"):
        on_meta = build()
    on_cpu = build()
    batch = torch.randn(3, 24)
    meta = trace(on_meta, batch)
    cpu = trace(on_cpu, batch, device="cpu")
    assert (meta.traced_on, cpu.traced_on) == ("meta", "cpu")
    assert meta.flops(8) == pytest.approx(cpu.flops(8))
    assert meta.by_class(3) == pytest.approx(cpu.by_class(3))
    assert meta.activation_bytes.at(8) == pytest.approx(cpu.activation_bytes.at(8), rel=0.05)
    assert meta.fingerprint == cpu.fingerprint
    assert all(p.device.type == "meta" and p.grad is None for p in on_meta.parameters())


def test_fake_tensor_path_traces_like_meta():
    # The fake-CUDA path needs a CUDA build of torch; its FakeTensorMode machinery runs
    # here with fake CPU tensors and must give what meta gives.
    fake = api._trace_paired("fake-cpu", TinyGPT(), gpt_batch(), None, "bf16", False)
    meta = api._trace_paired("meta", TinyGPT(), gpt_batch(), None, "bf16", False)
    assert fake[0] == meta[0] and fake[1] == meta[1] and fake[2] == meta[2] == (1, 2)


def test_fake_cuda_is_skipped_without_a_cuda_build():
    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("this torch has CUDA support")
    with pytest.raises(UserError, match=r"no tracer could run.*no CUDA support"):
        trace(nn.Linear(4, 4), torch.randn(2, 4), device="fake-cuda")
    profile = trace(nn.Linear(4, 4), torch.randn(2, 4))
    assert profile.extra["attempts"]["fake-cuda"].startswith("skipped")


def test_dropout_runs_the_fused_cuda_kernel_on_meta():
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 4))
    profile = trace(model, torch.randn(2, 8), precision="bf16")
    (fwd,) = ops_of(profile, op="aten.native_dropout")
    (bwd,) = ops_of(profile, op="aten.native_dropout_backward")
    assert (fwd.phase, bwd.phase, fwd.dtype) == ("forward", "backward", "bf16")
    assert fwd.bytes.per_sample == 16 * (2 + 2 + 1)  # bf16 in and out, a bool mask
    assert not ops_of(profile, op="aten.bernoulli_")


def test_the_callers_model_is_left_alone():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)
    )
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for device in ("meta", "cpu"):
        trace(model, torch.randn(2, 3, 8, 8), device=device)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# -- memory ---------------------------------------------------------------------------


def test_activation_peak_agrees_with_saved_tensors():
    torch.manual_seed(0)
    model, batch = mlp(), torch.randn(64, 128)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(batch).float().mean().backward()
    measured = sum(saved.values())
    traced = trace(model, batch).activation_bytes
    assert traced.at(64) == pytest.approx(measured, rel=0.30)
    assert traced.per_sample > 0 and abs(traced.fixed) < 0.1 * traced.at(64)


# -- model facts, fingerprint, JSON, cache -----------------------------------------------


def test_fingerprint_equal_models_and_changed_width():
    a, b = mlp(depth=2), mlp(depth=2)
    assert fingerprint_model(a, (128,)) == fingerprint_model(b, (128,))
    assert fingerprint_model(a, (128,)) != fingerprint_model(mlp(width=96, depth=2), (128,))
    assert fingerprint_model(a, (128,)) != fingerprint_model(a, (128,), precision="fp32")
    assert fingerprint_model(a, (128,)) != fingerprint_model(a, (64,))
    code = (
        "from torch import nn; from cloudtrain.profiling import fingerprint_model;"
        "m = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),"
        " nn.Linear(128, 10)); print(fingerprint_model(m, (128,)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert other.stdout.strip() == fingerprint_model(a, (128,))


def test_profile_round_trips_through_json_and_counts_parameters():
    model = TinyGPT()
    model.wpe.weight.requires_grad_(False)
    profile = trace(model, gpt_batch(), precision="bf16")
    assert ModelProfile.from_json(profile.to_json()) == profile
    assert profile.parameters == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert profile.frozen_parameters == model.wpe.weight.numel()
    assert profile.name == "TinyGPT"
    assert profile.parameter_tensors == sum(1 for p in model.parameters() if p.requires_grad)


def test_second_call_is_served_from_the_cache():
    model = mlp(depth=2)
    first = profile_model(model, torch.randn(2, 128), precision="fp32")
    count = api.TRACE_COUNT
    second = profile_model(mlp(depth=2), torch.randn(5, 128), precision="fp32")
    assert first.extra["traced"] is True and second.extra["traced"] is False
    assert count == api.TRACE_COUNT and second.ops == first.ops
    assert list(api.cache_dir().glob(f"{first.fingerprint}-*.json"))
    profile_model(mlp(width=64, depth=2), torch.randn(2, 64), precision="fp32")
    assert count + 1 == api.TRACE_COUNT


def test_default_loss_from_a_dict_batch_and_an_output_with_loss():
    class HFLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(50, 16), nn.Linear(16, 50)

        def forward(self, input_ids, labels, return_dict=True):
            logits = self.head(self.embed(input_ids))
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return SimpleNamespace(loss=loss, logits=logits)

    ids = torch.randint(0, 50, (1, 12))  # one sample: repeated for batch 2
    profile = trace(HFLike(), {"input_ids": ids, "labels": ids, "return_dict": True})
    assert profile.tokens_per_sample == 12 and profile.sample_shape == (12,)
    assert ops_of(profile, op="aten.embedding_dense_backward")
    (head,) = ops_of(profile, op_class="matmul", phase="forward")
    assert head.flops.per_sample == 2 * 12 * 16 * 50


# -- what the tracer cannot count, and errors -----------------------------------------------


def test_unknown_ops_are_named_in_the_notes():
    class Doubler(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return double(self.lin(x))

    profile = trace(Doubler(), torch.randn(2, 8))
    assert "1 ops without a rule: cloudtrain_test.double" in profile.notes
    (op,) = ops_of(profile, op="cloudtrain_test.double")
    assert op.op_class == "elementwise" and op.flops.per_sample == 8


class Specialised(nn.Module):
    """Runs an extra op at some batch sizes (like PyTorch skipping copies at batch 1)."""

    def __init__(self, odd_at) -> None:
        super().__init__()
        self.lin, self.odd_at = nn.Linear(8, 4), odd_at

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if self.odd_at(x.shape[0]) else y


def test_a_batch_1_specialisation_pairs_batch_2_and_3():
    profile = trace(Specialised(lambda b: b == 1), torch.randn(4, 8))
    assert profile.traced_batches == (2, 3) and profile.notes == ()
    (fwd,) = ops_of(profile, op="aten.addmm")
    assert (fwd.flops.fixed, fwd.flops.per_sample) == (0, 2 * 8 * 4)
    assert fwd.bytes.fixed == (8 * 4 + 4) * 4
    assert not ops_of(profile, op="aten.mul", phase="forward")


def test_data_dependent_steps_fall_back_to_proportional_costs():
    profile = trace(Specialised(lambda b: b % 2 == 1), torch.randn(1, 8))
    assert any("different ops" in note for note in profile.notes)
    assert all(o.flops.fixed == 0 and o.bytes.fixed == 0 for o in profile.ops)
    (fwd,) = ops_of(profile, op="aten.addmm")
    assert fwd.flops.per_sample == 2 * 8 * 4
    assert fwd.gemm[1] == fwd.gemm[1].__class__(4.0, 0.0)  # N as traced, M scaled


@pytest.mark.parametrize(
    ("model", "batch", "loss_fn", "message"),
    [
        (nn.Linear(64, 32), torch.randn(4, 10), None, "failed on the batch"),
        (nn.Linear(4, 3), torch.randn(2, 4), lambda m, b: m(b), "scalar"),
        (nn.Linear(4, 3).requires_grad_(False), torch.randn(2, 4), None, "no trainable"),
        (nn.Linear(4, 3), (torch.randn(2, 4), torch.randn(3, 4)), None, "leading"),
    ],
)
def test_user_errors(model, batch, loss_fn, message):
    with pytest.raises(UserError, match=message) as caught:
        trace(model, batch, loss_fn)
    assert "\n" not in str(caught.value)


def test_op_class_table():
    assert op_class_of("aten.addmm") == "matmul"
    assert op_class_of("aten.convolution_backward") == "convolution"
    assert op_class_of("aten._scaled_dot_product_flash_attention_backward") == "attention"
    assert op_class_of("aten.native_layer_norm_backward") == "reduction"
    assert op_class_of("aten._to_copy") == "data_movement"
    assert op_class_of("aten.add_") == "elementwise"
    assert op_class_of("aten.gelu_backward") == "elementwise"
    assert op_class_of("aten.view") == "data_movement"
    assert op_class_of("aten.never_heard_of") == "elementwise"
