"""`cloudtrain doctor`: each check driven to pass / warn / fail by its inputs; the whole
doctor on recorded NVML readings and on this machine; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.diagnose import TorchFacts, run_doctor
from cloudtrain.diagnose import checks as c
from cloudtrain.diagnose.doctor import measure_read
from cloudtrain.monitor import open_nvml

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
CUDA_TORCH = TorchFacts("2.5.1+cu124", "12.4", True, 2, 90100, "2.21.5")
MIB, GIB = c.MIB, c.GIB


def test_gpu_visible():
    assert c.check_gpu_visible(True, None, 8).status == "pass"
    no_gpu = c.check_gpu_visible(False, "NVML library not found", 0)
    assert no_gpu.status == "warn" and "No NVIDIA GPU" in no_gpu.summary and no_gpu.fix


def test_torch_cuda():
    assert c.check_torch_cuda(None, None, False, 0, 0).status == "fail"
    assert c.check_torch_cuda("2.5", None, False, 0, 0).status == "pass"  # CPU box, CPU torch
    assert c.check_torch_cuda("2.5", None, False, 0, 2).status == "fail"
    assert c.check_torch_cuda("2.5", "12.4", False, 0, 2).status == "fail"
    hidden = c.check_torch_cuda("2.5", "12.4", True, 1, 2)
    assert hidden.status == "warn" and "CUDA_VISIBLE_DEVICES" in hidden.fix
    assert c.check_torch_cuda("2.5", "12.4", True, 2, 2).status == "pass"


def test_driver_new_enough_for_torch_cuda():
    assert c.check_driver_cuda("550.54", 12040, "12.4").status == "pass"
    assert c.check_driver_cuda("550.54", 12040, "12.1").status == "pass"
    minor = c.check_driver_cuda("535.104", 12020, "12.4")
    assert minor.status == "warn" and "12.2" in minor.summary
    old = c.check_driver_cuda("470.182", 11040, "12.4")
    assert old.status == "fail" and "upgrade the NVIDIA driver" in old.fix
    assert c.check_driver_cuda(None, None, "12.4").status == "skip"


def test_cudnn_and_nccl():
    assert c.check_cudnn_nccl("12.4", 90100, "2.21.5", 8).status == "pass"
    assert c.check_cudnn_nccl("12.4", None, "2.21.5", 1).status == "fail"
    assert c.check_cudnn_nccl("12.4", 90100, None, 4).status == "warn"
    assert c.check_cudnn_nccl(None, None, None, 0).status == "skip"


def test_shm_docker_default_fails():
    docker = c.check_shm(64 * MIB)
    assert docker.status == "fail" and "--shm-size" in docker.fix
    assert c.check_shm(2 * GIB).status == "warn"
    assert c.check_shm(32 * GIB).status == "pass"
    assert c.check_shm(None).status == "warn"


def test_ulimits():
    assert c.check_ulimits(8 * MIB, 65536, 8).status == "warn"
    assert c.check_ulimits(8 * MIB, 65536, 1).status == "pass"  # memlock matters for comms
    files = c.check_ulimits(None, 1024, 1)
    assert files.status == "warn" and "ulimit -n" in files.fix
    assert c.check_ulimits(None, None, 8).summary == "memlock unlimited, open files unlimited"


def test_cpu_cores_per_gpu():
    assert c.check_cpu_per_gpu(8, 8).status == "warn"
    assert c.check_cpu_per_gpu(96, 8).status == "pass"
    assert c.check_cpu_per_gpu(2, 0).status == "skip"


def gpu(**values) -> c.GPUFacts:
    base = dict(
        index=0,
        name="H100",
        util_pct=90.0,
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        persistence_mode=True,
        ecc_enabled=True,
        ecc_uncorrected=0,
        remapped_rows_pending=False,
        remapped_rows_failed=False,
        numa_node=0,
    )
    return c.GPUFacts(**{**base, **values})


def test_pcie_link_width_and_generation_under_load():
    assert c.check_pcie_links([gpu()]).status == "pass"
    narrow = c.check_pcie_links([gpu(pcie_width=8)])
    assert narrow.status == "warn" and "x8" in narrow.summary
    assert c.check_pcie_links([gpu(pcie_gen=3)]).status == "warn"
    idle = c.check_pcie_links([gpu(pcie_gen=1, util_pct=0.0)])
    assert idle.status == "pass" and "idle links downshift" in idle.summary
    assert c.check_pcie_links([]).status == "skip"


def test_persistence_and_ecc():
    off = c.check_persistence([gpu(), gpu(index=1, persistence_mode=False)])
    assert off.status == "warn" and "[1]" in off.summary and "nvidia-smi -pm 1" in off.fix
    assert c.check_persistence([gpu()]).status == "pass"
    assert c.check_ecc([gpu()]).status == "pass"
    assert c.check_ecc([gpu(ecc_uncorrected=3)]).status == "fail"
    assert c.check_ecc([gpu(remapped_rows_failed=True)]).status == "fail"
    assert c.check_ecc([gpu(remapped_rows_pending=True)]).status == "warn"
    assert c.check_ecc([gpu(ecc_enabled=False)]).status == "warn"


def test_topology_and_numa():
    gpus = [gpu(), gpu(index=1, numa_node=1)]
    far = c.check_topology(gpus, {(0, 1): 50}, {0: False, 1: False})
    assert far.status == "warn" and "numactl" in far.fix and "NUMA nodes [0, 1]" in far.summary
    assert c.check_topology(gpus, {(0, 1): 50}, {0: True, 1: True}).status == "pass"
    assert c.check_topology(gpus, {(0, 1): 20}, {}).status == "pass"
    assert c.check_topology([gpu()], {}, {}).status == "skip"


def test_read_throughput(tmp_path: Path):
    assert c.check_read_throughput(None, None, 0).status == "skip"
    assert c.check_read_throughput("/data", 120.0, 256).status == "warn"
    assert c.check_read_throughput("/data", 2500.0, 256).status == "pass"
    assert c.check_read_throughput("/data", 2500.0, 1).status == "skip"  # too little data
    (tmp_path / "shard-0.bin").write_bytes(b"\0" * (3 * MIB))
    speed, mib = measure_read(tmp_path)
    assert mib == pytest.approx(3.0) and speed > 0
    assert measure_read(tmp_path / "missing") == (None, 0.0)


def test_debugging_variables_cost_speed():
    env = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    costly = c.check_debug_env(env)
    assert costly.status == "warn"
    for name in env:
        assert name in costly.summary and f"unset {name}" in costly.fix
    assert c.check_debug_env({"NCCL_DEBUG": "WARN", "CUDA_LAUNCH_BLOCKING": "0"}).status == "pass"


def test_gloo_should_use_the_interface_nccl_was_pinned_to():
    pinned = c.check_network_interfaces({"NCCL_SOCKET_IFNAME": "ens5"})
    assert pinned.status == "warn" and pinned.fix == "export GLOO_SOCKET_IFNAME=ens5"
    both = {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5"}
    assert c.check_network_interfaces(both).status == "pass"
    assert c.check_network_interfaces({}).status == "pass"


def test_doctor_on_a_recorded_healthy_h100_pair():
    result = run_doctor(nvml=open_nvml(FIXTURES / "h100_load.json"), torch=CUDA_TORCH, env={})
    status = {check.name: check.status for check in result.checks}
    assert result.gpu_count == 2 and result.no_gpu_reason is None
    assert status["gpu_driver"] == status["torch_cuda"] == status["driver_cuda"] == "pass"
    assert status["pcie_link"] == status["persistence_mode"] == status["ecc"] == "pass"
    assert status["topology"] == "pass"


def test_doctor_on_a_recorded_troubled_a100():
    torch = TorchFacts("2.5.1+cu124", "12.4", True, 1, 90100, "2.21.5")
    result = run_doctor(nvml=open_nvml(FIXTURES / "a100_throttled.json"), torch=torch, env={})
    status = {check.name: check.status for check in result.checks}
    assert status["driver_cuda"] == "warn"  # driver 535 supports CUDA 12.2 < 12.4
    assert status["pcie_link"] == "warn" and status["persistence_mode"] == "warn"
    assert result.worst == "warn"


def test_doctor_without_gpu_says_so_and_checks_the_rest():
    result = run_doctor(nvml=open_nvml(FIXTURES / "no_driver.json"), env={})
    assert result.gpu_count == 0
    assert result.no_gpu_reason == "NVML library not found (no NVIDIA driver installed)"
    status = {check.name: check.status for check in result.checks}
    assert status["dev_shm"] in ("pass", "warn", "fail") and status["ulimits"] != "skip"
    assert status["pcie_link"] == status["ecc"] == "skip"


def test_cli_doctor_json_and_text(run_cli, tmp_path: Path):
    done = run_cli(
        "doctor",
        "--json",
        "--data-dir",
        str(tmp_path),
        env={"CLOUDTRAIN_NVML_RECORDING": str(FIXTURES / "no_driver.json")},
    )
    assert done.code == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["gpu_count"] == 0 and payload["no_gpu_reason"]
    assert {c["name"] for c in payload["checks"]} >= {"dev_shm", "ulimits", "debug_env"}
    text = run_cli(
        "doctor",
        env={
            "CLOUDTRAIN_NVML_RECORDING": str(FIXTURES / "no_driver.json"),
            "CUDA_LAUNCH_BLOCKING": "1",
        },
    )
    assert "No GPU on this machine" in text.stdout and "CUDA_LAUNCH_BLOCKING" in text.stdout
    missing = run_cli("doctor", "--data-dir", str(tmp_path / "nope"))
    assert missing.code == 2 and "no such file" in missing.stderr


def test_cli_doctor_exits_1_on_a_failed_check(run_cli):
    # a recorded GPU with the CPU-only torch of this test machine: torch_cuda fails
    done = run_cli("doctor", env={"CLOUDTRAIN_NVML_RECORDING": str(FIXTURES / "h100_load.json")})
    import torch

    if torch.version.cuda:
        pytest.skip("torch here is a CUDA build")
    assert done.code == 1 and "fail" in done.stdout
