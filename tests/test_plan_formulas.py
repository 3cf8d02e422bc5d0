"""Each planner formula against a hand-worked example (numbers worked out in the comments)."""

from __future__ import annotations

import math

import pytest

from cloudtrain.catalog.types import GPUSpec, Offer
from cloudtrain.errors import UnknownNameError, UserError
from cloudtrain.plan import (
    PRESETS,
    Assumptions,
    Workload,
    cost,
    flops_per_token,
    memory,
    perf,
    preset,
)
from cloudtrain.plan.workload import hardware_flops_per_sample, model_flops_per_sample

GIB = 1024**3


def small(**changes) -> Workload:
    """1e9 parameters, 10 layers, hidden 1000, 10 heads, 100 tokens per sample."""
    values = dict(
        name="small", parameters=1e9, layers=10, hidden_size=1000, heads=10, seq_len=100,
        global_batch=64, tokens=1e9,
    )  # fmt: skip
    values.update(changes)
    return Workload(**values)


A100 = GPUSpec(
    name="A100-80GB", vendor="nvidia", architecture="ampere", memory_gib=80,
    memory_bandwidth_gbps=2039, tdp_w=400, fp32_tflops=19.5, tf32_tflops=156,
    bf16_tflops=312, fp16_tflops=312, link_kind="nvlink", link_gbps_per_direction=300, pcie_gen=4,
)  # fmt: skip


def offer(gpus: int = 8, network_gbps: float | None = 400.0, vcpus: int = 96) -> Offer:
    return Offer(
        provider="aws", region="us-east-1", instance_type="p4de", gpu="A100-80GB",
        gpu_count=gpus, vcpus=vcpus, ram_gib=1152, price_usd_per_hour=40.0,
        network_gbps=network_gbps,
    )  # fmt: skip


# ---------------------------------------------------------------- FLOPs


def test_flops_per_token_is_6n_plus_12lhqt():
    # 6 * 1e9 + 12 * 10 layers * 1000 hidden * 100 tokens = 6e9 + 1.2e7
    assert flops_per_token(small()) == pytest.approx(6.012e9)


def test_recomputation_adds_one_forward():
    # 8N + 16LHQT = 8e9 + 1.6e7
    assert flops_per_token(small(), recompute=True) == pytest.approx(8.016e9)
    per_sample = model_flops_per_sample(small())
    assert per_sample == pytest.approx(6.012e9 * 100)
    assert hardware_flops_per_sample(small(), recompute=True) == pytest.approx(per_sample * 4 / 3)


def test_embedding_lookup_is_left_out_of_6n():
    # (1e9 - 1e8) * 6 + 1.2e7
    assert flops_per_token(small(embedding_parameters=1e8)) == pytest.approx(5.412e9)


def test_non_transformer_trains_at_three_forwards():
    cnn = Workload(
        name="cnn", parameters=25e6, forward_flops_per_sample=8e9, global_batch=256,
        samples_per_epoch=1000, epochs=2,
    )  # fmt: skip
    assert model_flops_per_sample(cnn) == 24e9
    assert hardware_flops_per_sample(cnn, recompute=True) == pytest.approx(32e9)
    assert cnn.total_samples == 2000


def test_gpt2_preset_matches_the_published_flops_per_token():
    # nanoGPT / llm.c: ~ 6 * 124M + 12 * 12 * 768 * 1024 ~ 0.855 GFLOP per token
    assert flops_per_token(preset("gpt2-124m")) == pytest.approx(0.855e9, rel=0.01)


def test_workload_validation_names_the_fix():
    with pytest.raises(UnknownNameError, match="did you mean bf16"):
        small(precision="bf61")
    with pytest.raises(UserError, match="forward_flops_per_sample"):
        Workload(name="x", parameters=1e6, global_batch=8, samples_per_epoch=10)
    with pytest.raises(UserError, match="tokens or samples_per_epoch"):
        small(tokens=None)


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("precision", "optimizer", "expected"),
    [("bf16", "adamw", 16), ("fp32", "adamw", 16), ("bf16", "sgd", 12), ("fp32", "sgd", 12),
     ("bf16", "adafactor", 8), ("fp8", "adamw8bit", 10)],
)  # fmt: skip
def test_state_bytes_per_parameter(precision, optimizer, expected):
    assert memory.state_bytes_per_parameter(precision, optimizer) == expected


def test_activations_follow_korthikanti():
    # per layer s*h*(34 + 5*a*s/h) = 100*1000*(34 + 5*10*100/1000) = 3.9e6; x 10 layers
    assert memory.activation_bytes_per_sample(
        small(flash_attention=False), recompute=False
    ) == pytest.approx(39e6)
    # fused attention drops the 5as/h term: 34 * 1e5 * 10
    assert memory.activation_bytes_per_sample(small(), recompute=False) == pytest.approx(34e6)
    # full recomputation: 2*s*h per layer kept + one layer in flight: 2e5*10 + 3.4e6
    assert memory.activation_bytes_per_sample(small(), recompute=True) == pytest.approx(5.4e6)
    # fp32 doubles; logits add 4*s*V
    assert memory.activation_bytes_per_sample(
        small(precision="fp32"), recompute=False
    ) == pytest.approx(68e6)
    assert memory.activation_bytes_per_sample(
        small(vocab_size=1000), recompute=False
    ) == pytest.approx(34e6 + 4e5)


def test_largest_micro_batch_ddp_and_fsdp():
    # 80 GiB x 0.9 = 72 GiB; states 16e9 B; overhead 1.5 GiB; 34e6 B per sample
    fit = memory.memory_fit(small(), 80, 8, "ddp", False)
    room = 72 * GIB - 16e9 - 1.5 * GIB
    assert fit.max_micro_batch == math.floor(room / 34e6)
    # FSDP over 4: states / 4, plus two layers' unsharded weights + fp32 grads: 2*1e8*(2+4)
    fsdp = memory.memory_fit(small(), 80, 4, "fsdp", False)
    room = 72 * GIB - 4e9 - 1.5 * GIB - 1.2e9
    assert fsdp.max_micro_batch == math.floor(room / 34e6)
    assert fsdp.states_gib == pytest.approx(4e9 / GIB)


def test_a_model_too_big_for_one_gpu_needs_sharding():
    big = small(parameters=10e9)  # 160e9 B of states > 72 GiB
    assert memory.memory_fit(big, 80, 8, "ddp", True).max_micro_batch == 0
    assert memory.memory_fit(big, 80, 8, "fsdp", False).max_micro_batch > 0


def test_split_batch():
    assert memory.split_batch(512, 8, 48) == memory.BatchSplit(32, 2, 512)
    assert memory.split_batch(100, 8, 100) == memory.BatchSplit(13, 1, 104)
    assert memory.split_batch(4, 8, 10) is None  # more GPUs than samples
    assert memory.split_batch(16, 2, 0) is None  # nothing fits


# ---------------------------------------------------------------- step time


def test_ring_all_reduce_time():
    # 2 (n-1)/n B / bw: 2 * 7/8 * 1e9 / 300e9
    one_node = perf.collective_s(1e9, 2, 8, 1, 300.0, 50.0, 1.0)
    assert one_node == pytest.approx(2 * 7 / 8 * 1e9 / 300e9)
    # plus between 2 nodes over 400 Gbit/s = 50 GB/s: 2 * 1/2 * 1e9 / 50e9
    two_nodes = perf.collective_s(1e9, 2, 8, 2, 300.0, 50.0, 1.0)
    assert two_nodes == pytest.approx(one_node + 2 * 0.5 * 1e9 / 50e9)
    assert perf.collective_s(1e9, 2, 1, 1, 300.0, 50.0, 1.0) == 0.0


def test_step_time_ddp_with_overlap():
    a = Assumptions()
    step = perf.step_time(small(), A100, offer(), 1, ("ddp", False, 4, 2), 100.0, 0.5, a, None)
    compute = 8 * 6.012e11 / (100e12 * 0.5)  # 8 samples per GPU per step
    assert step.compute_s == pytest.approx(compute)
    comm = 2 * 7 / 8 * 4e9 / (300e9 * 0.8)  # fp32 gradients, 80% of NVLink
    assert step.comm_s == pytest.approx(comm)
    hidden = min(0.8 * comm, compute * (2 / 3) / 2)  # under the last micro-batch's backward
    assert step.step_s == pytest.approx(compute + comm - hidden)
    assert step.bottleneck == "compute"


def test_single_gpu_has_no_communication():
    a = Assumptions()
    step = perf.step_time(small(), A100, offer(1), 1, ("ddp", False, 4, 1), 100.0, 0.5, a, None)
    assert step.comm_s == 0 and step.exposed_comm_s == 0


def test_fsdp_communicates_every_micro_batch_and_slow_network_shows():
    a = Assumptions()
    net = offer(8, 10.0)
    fsdp1 = perf.step_time(small(), A100, net, 2, ("fsdp", False, 4, 1), 312.0, 0.5, a, None)
    fsdp2 = perf.step_time(small(), A100, net, 2, ("fsdp", False, 4, 2), 312.0, 0.5, a, None)
    ddp1 = perf.step_time(small(), A100, net, 2, ("ddp", False, 4, 1), 312.0, 0.5, a, None)
    ddp2 = perf.step_time(small(), A100, net, 2, ("ddp", False, 4, 2), 312.0, 0.5, a, None)
    # all-gather bf16 weights twice + reduce-scatter fp32 grads = 2*2 + 4 bytes x 1 pass,
    # the same volume as an fp32 all-reduce (4 bytes x 2 passes) per micro-batch ...
    assert fsdp1.comm_s == pytest.approx(ddp1.comm_s)
    # ... but FSDP repeats it for every micro-batch, DDP once per optimizer step
    assert fsdp2.comm_s == pytest.approx(2 * fsdp1.comm_s)
    assert ddp2.comm_s == pytest.approx(ddp1.comm_s)
    assert fsdp1.bottleneck == "communication"


def test_input_pipeline_bottleneck_is_flagged():
    images = Workload(
        name="cnn", parameters=25e6, forward_flops_per_sample=8e9, global_batch=256,
        samples_per_epoch=1000, data_kind="images",
    )  # fmt: skip
    a = Assumptions()
    # 8 GPUs x 32 samples; 9 vCPUs - 8 trainers = 1 usable at 150 images/s
    step = perf.step_time(
        images, A100, offer(8, vcpus=9), 1, ("ddp", False, 32, 1), 312, 0.25, a, 150
    )
    assert step.input_s == pytest.approx(256 / 150)
    assert step.bottleneck == "input"
    assert step.step_s == step.input_s


def test_default_efficiencies():
    h100 = GPUSpec("H100-SXM", "nvidia", "hopper", 80, 3350, 700, bf16_tflops=989, fp8_tflops=1979)
    ada = GPUSpec("L4", "nvidia", "ada", 24, 300, 72, bf16_tflops=121)
    assert perf.default_efficiency(small(), A100, "bf16").value == 0.5
    assert perf.default_efficiency(small(), h100, "bf16").value == 0.4
    assert perf.default_efficiency(small(), h100, "fp8").value == pytest.approx(0.26)
    assert perf.default_efficiency(small(), ada, "bf16").value == pytest.approx(0.44)
    assert perf.default_efficiency(small(), A100, "fp32").value == 0.7
    cnn = preset("resnet50")
    assert perf.default_efficiency(cnn, A100, "bf16").value == 0.25


def test_measured_matmul_scales_the_default():
    default = perf.default_efficiency(small(), A100, "bf16")
    measured = perf.measured_efficiency(default, A100, 0.80)
    assert measured.value == pytest.approx(0.5 * 0.80 / 0.869, abs=1e-4)
    assert "measured" in measured.source
    assert perf.measured_efficiency(default, A100, 0.3).value == pytest.approx(
        0.5 * 0.3 / 0.869, abs=1e-4
    )


def test_compute_dtype_falls_back():
    t4 = GPUSpec("T4", "nvidia", "turing", 16, 320, 70, fp32_tflops=8.1, fp16_tflops=65)
    assert perf.compute_dtype(small(), t4) == "fp16"
    assert perf.compute_dtype(small(precision="fp8"), t4) is None
    assert perf.compute_dtype(small(precision="tf32"), t4) == "fp32"


# ---------------------------------------------------------------- time, spot, energy


def test_hazard_from_monthly_band():
    # -ln(1 - 0.075) / 730 h
    assert cost.hazard_per_node_hour(0.075) == pytest.approx(-math.log(0.925) / 730)
    assert cost.hazard_per_node_hour(0.0) == 0.0


def test_young_interval():
    assert cost.young_interval_s(60, 3600) == pytest.approx(math.sqrt(2 * 60 * 3600))


def test_on_demand_timeline_counts_checkpoints_and_provisioning():
    a = Assumptions()
    t = cost.timeline(10_000, 60, 1, hazard_per_node_hour_=0.0, assumptions=a)
    assert t.total_s == pytest.approx(600 + 10_000 + 2 * 60)  # two hourly checkpoints
    assert t.expected_interruptions == 0


def test_spot_timeline_by_hand():
    a = Assumptions()
    t = cost.timeline(36_000, 60, 1, hazard_per_node_hour_=1.0, assumptions=a)
    tau = math.sqrt(2 * 60 * 3600)  # MTBF 1 h
    work = 36_000 + 36_000 / tau * 60
    running = work / (1 - (600 + tau / 2) / 3600)
    assert t.checkpoint_interval_s == pytest.approx(tau)
    assert t.total_s == pytest.approx(600 + running)
    assert t.expected_interruptions == pytest.approx(running / 3600)
    # twice the nodes, twice the hazard: more interruptions
    two = cost.timeline(36_000, 60, 2, hazard_per_node_hour_=1.0, assumptions=a)
    assert two.expected_interruptions > t.expected_interruptions


def test_spot_that_never_finishes_is_none():
    assert (
        cost.timeline(36_000, 60, 1, hazard_per_node_hour_=10.0, assumptions=Assumptions()) is None
    )


def test_energy():
    # 8 x (400 W x 0.8 + 150 W host) x 10 h x PUE 1.1 / 1000
    assert cost.energy_kwh(8, 400, 10, 1.1, Assumptions()) == pytest.approx(
        8 * 470 * 10 * 1.1 / 1000
    )


# ---------------------------------------------------------------- presets and files


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_complete_and_cited(name):
    workload = preset(name)
    assert workload.source and workload.total_samples > 0
    assert model_flops_per_sample(workload) > 0
    assert memory.activation_bytes_per_sample(workload, recompute=False) > 0


def test_workload_file(tmp_path):
    from cloudtrain.errors import DataError
    from cloudtrain.plan import load_workload_file

    path = tmp_path / "w.toml"
    path.write_text(
        'name = "mine"\nparameters = 3e8\nlayers = 24\nhidden_size = 1024\nheads = 16\n'
        "seq_len = 2048\nglobal_batch = 256\ntokens = 5e9\n"
    )
    workload, constraints = load_workload_file(path)
    assert workload.name == "mine" and workload.layers == 24 and constraints == {}
    path.write_text("[workload\n")
    with pytest.raises(DataError, match=r"w\.toml"):
        load_workload_file(path)
    path.write_text('[workload]\npreset = "resnet50"\nepochs = 10\n')
    assert load_workload_file(path)[0].total_samples == pytest.approx(12_811_670)


@pytest.mark.slow
def test_bert_preset_counts_its_tied_decoder_as_a_traced_bert_does():
    """BERT's MLM decoder reuses the word embedding: a 768 x 30522 matmul on every token
    that 6N must include (before: 20% fewer FLOPs than a traced BERT-base)."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import zoo
    from cloudtrain.profiling import profile_model

    spec = zoo.MODELS["bert-base"]
    with torch.device("meta"):
        model = spec.build()
    traced = profile_model(model, zoo.example_batch(spec, 2, device="meta"), zoo.loss_fn(spec))
    per_token = traced.flops_per_sample() / 512
    assert flops_per_token(preset("bert-base")) == pytest.approx(per_token, rel=0.03)
