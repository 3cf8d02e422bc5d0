"""Exports: SkyPilot task YAML, Kubeflow TrainJob / PyTorchJob, ONNX."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cloudtrain.errors import UnknownNameError, UserError
from cloudtrain.launch import k8s, skypilot
from cloudtrain.launch.skypilot import SkyPilotSpec, build_task, skypilot_accelerator

FIXTURES = Path(__file__).parent / "fixtures" / "launch"
SCRIPTS = Path(__file__).parent / "_launch_scripts"


def _spec(**changes) -> SkyPilotSpec:
    base = dict(
        command=("train.py", "--lr", "3e-4", "--name", "a b"),
        gpu="H100", gpus_per_node=8, nodes=2, infra="aws/us-east-1", spot=True,
        disk_gb=512, bucket="s3://ckpts/run1", setup="pip install -e .",
    )  # fmt: skip
    base.update(changes)
    return SkyPilotSpec(**base)


# ---------------------------------------------------------------- SkyPilot


def test_skypilot_task_has_every_part():
    task = yaml.safe_load(skypilot.to_yaml(build_task(_spec())))
    resources = task["resources"]
    assert resources["infra"] == "aws/us-east-1"
    assert resources["accelerators"] == "H100:8"
    assert resources["disk_size"] == 512
    assert resources["any_of"] == [{"use_spot": True}, {"use_spot": False}]
    assert resources["job_recovery"] == {
        "strategy": "EAGER_NEXT_REGION",
        "max_restarts_on_errors": 3,
    }
    assert task["num_nodes"] == 2
    assert task["file_mounts"]["/checkpoints"] == {
        "source": "s3://ckpts/run1",
        "mode": "MOUNT_CACHED",
    }
    assert task["envs"]["CLOUDTRAIN_CHECKPOINT_DIR"] == "/checkpoints"
    assert task["setup"] == "pip install -e .\n"
    run = task["run"]
    for var in ("SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK",
                "SKYPILOT_NUM_GPUS_PER_NODE"):  # fmt: skip
        assert f"${var}" in run
    assert "python -m torch.distributed.run" in run
    assert "train.py --lr 3e-4 --name 'a b'" in run  # arguments shell-quoted


def test_skypilot_run_line_runs_in_a_shell(tmp_path: Path):
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    run = build_task(_spec(command=("echo", "it's", "ok")))["run"]
    script = run.replace("python -m torch.distributed.run", "echo torchrun")
    env = {**os.environ, "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_GPUS_PER_NODE": "8"}  # fmt: skip
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True).stdout
    assert "--nnodes=2 --nproc-per-node=8 --node-rank=1 --master-addr=10.0.0.5" in out
    assert "echo it's ok" in out


def test_skypilot_defaults_and_plain_bucket_names():
    task = build_task(_spec(spot=False, bucket="my-ckpts", infra=None, disk_gb=None, setup=None))
    assert "any_of" not in task["resources"] and "infra" not in task["resources"]
    assert task["file_mounts"]["/checkpoints"]["name"] == "my-ckpts"
    assert "setup" not in task


def test_skypilot_translates_catalog_names():
    assert skypilot_accelerator("H100-SXM") == "H100"
    assert skypilot_accelerator("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert skypilot_accelerator("a100-40gb") == "A100"
    assert skypilot_accelerator("l4") == "L4"


def test_skypilot_checks_what_skypilot_only_checks_at_launch():
    with pytest.raises(UnknownNameError, match="did you mean H100"):
        build_task(_spec(gpu="H10O"))
    with pytest.raises(UnknownNameError, match="FAILOVER"):
        build_task(_spec(recovery_strategy="FAILOVR"))
    with pytest.raises(UnknownNameError, match="did you mean aws"):
        build_task(_spec(infra="aws2/us-east-1"))
    with pytest.raises(UserError, match="no SkyPilot accelerator"):
        build_task(_spec(gpu="V100-PCIe-16GB"))
    with pytest.raises(UserError, match="--count"):
        build_task(_spec(gpus_per_node=0))
    assert (
        build_task(_spec(recovery_strategy="failover"))["resources"]["job_recovery"]["strategy"]
        == "FAILOVER"
    )


def test_skypilot_from_a_catalog_offer():
    from cloudtrain.catalog import Offer

    offer = Offer("AWS", "us-east-1", "p4d.24xlarge", "A100-40GB", 8, 96, 1152, 32.77, 9.0)
    task = build_task(SkyPilotSpec.from_offer(offer, ("train.py",)))
    assert task["resources"]["accelerators"] == "A100:8"
    assert task["resources"]["infra"] == "aws/us-east-1"
    assert "any_of" in task["resources"]


def test_a_spot_policy_can_pin_the_task():
    task = build_task(_spec())
    spot = skypilot.with_cluster_type(task, "spot")
    on_demand = skypilot.with_cluster_type(task, "on-demand")
    assert spot["resources"]["use_spot"] is True and "any_of" not in spot["resources"]
    assert on_demand["resources"]["use_spot"] is False
    assert "any_of" in task["resources"]  # the original is left alone
    with pytest.raises(UserError):
        skypilot.with_cluster_type(task, "none")


def _sky_python() -> str:
    """A Python with SkyPilot: this one, or CLOUDTRAIN_TEST_SKY_PYTHON (a separate venv)."""
    if skypilot.skypilot_available():
        return sys.executable
    other = os.environ.get("CLOUDTRAIN_TEST_SKY_PYTHON")
    if other:
        return other
    pytest.skip("SkyPilot not installed (pip install skypilot, or set CLOUDTRAIN_TEST_SKY_PYTHON)")


_SKY_PARSE = """
import sys, yaml, sky
task = sky.Task.from_yaml_config(yaml.safe_load(sys.stdin))
print(task.num_nodes, sorted(str(r) for r in task.resources))
"""


@pytest.mark.parametrize("changes", [{}, {"bucket": "plain-name", "infra": "k8s", "nodes": 1}])
def test_skypilot_parses_our_yaml(changes):
    text = skypilot.to_yaml(build_task(_spec(**changes)))
    done = subprocess.run(
        [_sky_python(), "-c", _SKY_PARSE], input=text, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "H100" in done.stdout


def test_cli_export_skypilot(run_cli, tmp_path: Path):
    out = tmp_path / "task.yaml"
    done = run_cli(
        "export", "skypilot", "--gpu", "A100-80GB", "--count", "4", "--nodes", "2", "--spot",
        "--bucket", "gs://b/x", "--no-check", "-o", str(out), "--", "train.py", "--epochs", "3",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    task = yaml.safe_load(out.read_text())
    assert task["resources"]["accelerators"] == "A100-80GB:4"
    assert task["run"].rstrip().endswith("train.py --epochs 3")
    bad = run_cli("export", "skypilot", "--gpu", "H1OO", "--", "train.py")
    assert bad.code == 2 and "did you mean" in bad.stderr


# ---------------------------------------------------------------- Kubernetes


def _validator(name: str):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((FIXTURES / name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _k8s_spec(**changes) -> k8s.K8sSpec:
    base = dict(command=("train.py", "--lr", "1e-3"), image="ghcr.io/me/train:1", nodes=4,
                gpus_per_node=8, shm_gib=16, checkpoint_pvc="ckpts")  # fmt: skip
    base.update(changes)
    return k8s.K8sSpec(**base)


def test_trainjob_matches_the_schema():
    manifest = yaml.safe_load(k8s.to_yaml(k8s.train_job(_k8s_spec())))
    _validator("trainjob.schema.json").validate(manifest)
    spec = manifest["spec"]
    assert spec["runtimeRef"]["name"] == "torch-distributed"
    assert spec["trainer"]["numNodes"] == 4
    assert spec["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert spec["trainer"]["command"] == ["torchrun", "train.py", "--lr", "1e-3"]
    override = spec["podSpecOverrides"][0]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16384Mi"}} in override[
        "volumes"
    ]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in override["containers"][0]["volumeMounts"]


def test_legacy_pytorchjob_matches_the_schema():
    manifest = yaml.safe_load(k8s.to_yaml(k8s.pytorch_job(_k8s_spec(min_nodes=2))))
    _validator("pytorchjob.schema.json").validate(manifest)
    spec = manifest["spec"]
    assert spec["elasticPolicy"]["minReplicas"] == 2 and spec["elasticPolicy"]["maxReplicas"] == 4
    assert spec["elasticPolicy"]["rdzvBackend"] == "c10d"
    container = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_the_schemas_catch_mistakes():
    import jsonschema

    trainjob = k8s.train_job(_k8s_spec())
    trainjob["spec"]["trainer"]["numNode"] = trainjob["spec"]["trainer"].pop("numNodes")
    with pytest.raises(jsonschema.ValidationError):
        _validator("trainjob.schema.json").validate(trainjob)
    legacy = k8s.pytorch_job(_k8s_spec())
    legacy["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = (
        "main"
    )
    with pytest.raises(jsonschema.ValidationError):
        _validator("pytorchjob.schema.json").validate(legacy)


def test_k8s_validation_and_cpu_jobs():
    with pytest.raises(UserError, match="--image"):
        k8s.train_job(_k8s_spec(image=""))
    with pytest.raises(UserError, match="--min-nodes"):
        k8s.pytorch_job(_k8s_spec(min_nodes=9))
    cpu = k8s.train_job(_k8s_spec(gpus_per_node=0, checkpoint_pvc=None, shm_gib=None))
    _validator("trainjob.schema.json").validate(cpu)
    assert "resourcesPerNode" not in cpu["spec"]["trainer"]


def test_cli_export_k8s(run_cli):
    done = run_cli("export", "k8s", "--image", "img:1", "--count", "2", "--nodes", "3",
                   "--legacy", "--", "train.py", "--x", "1")  # fmt: skip
    assert done.code == 0, done.stderr
    manifest = yaml.safe_load(done.stdout)
    assert manifest["kind"] == "PyTorchJob"
    _validator("pytorchjob.schema.json").validate(manifest)


# ---------------------------------------------------------------- ONNX


@pytest.fixture
def onnx_ready():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")


def _train_a_bit(model: torch.nn.Module) -> None:
    """Move the weights (and BatchNorm statistics) away from their initial values."""
    torch.manual_seed(1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(4, 3, 8, 8)).square().mean()
        optim.zero_grad()
        loss.backward()
        optim.step()


def test_onnx_from_a_trainer_checkpoint_matches_pytorch(onnx_ready, tmp_path: Path):
    from cloudtrain.launch.onnx_export import export_onnx
    from cloudtrain.runtime.checkpoint import CheckpointManager

    sys.path.insert(0, str(SCRIPTS))
    try:
        import onnx_model
    finally:
        sys.path.remove(str(SCRIPTS))
    model = onnx_model.build_cnn()
    _train_a_bit(model)
    state = {"model": model.state_dict(), "trainer": {"step": 7}}
    CheckpointManager(tmp_path / "ckpt").save(7, lambda: state, {"rng": {}})
    result = export_onnx(
        tmp_path / "ckpt", f"{SCRIPTS / 'onnx_model.py'}:build_cnn", (2, 3, 8, 8),
        tmp_path / "m.onnx",
    )  # fmt: skip
    assert result.step == 7 and Path(result.path).is_file()
    assert result.max_abs_diff < 1e-4
    # The check really compares: a model with other weights does not match.
    import onnxruntime as ort

    session = ort.InferenceSession(result.path, providers=["CPUExecutionProvider"])
    x = torch.randn(3, 3, 8, 8)
    fresh = onnx_model.build_cnn().eval()
    model.eval()
    got = session.run(None, {"input": x.numpy()})[0]
    assert abs(got - model(x).detach().numpy()).max() < 1e-4
    assert abs(got - fresh(x).detach().numpy()).max() > 1e-3


def test_onnx_token_model_from_a_state_dict_file(onnx_ready, tmp_path: Path, run_cli):
    sys.path.insert(0, str(SCRIPTS))
    try:
        import onnx_model
    finally:
        sys.path.remove(str(SCRIPTS))
    torch.manual_seed(3)
    model = onnx_model.build_lm()
    # as torch.compile's wrapper saves them: every key with the _orig_mod. prefix
    compiled_keys = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save(compiled_keys, tmp_path / "weights.pt")
    done = run_cli(
        "export", "onnx", str(tmp_path / "weights.pt"), "--model",
        f"{SCRIPTS / 'onnx_model.py'}:build_lm", "--input-shape", "2,5", "--input-dtype",
        "int64", "--input-high", "50", "-o", str(tmp_path / "lm.onnx"), "--json",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["max_abs_diff"] < 1e-4 and result["step"] is None


def test_onnx_errors(onnx_ready, tmp_path: Path, run_cli):
    torch.save({"w": torch.zeros(1)}, tmp_path / "w.pt")
    factory = f"{SCRIPTS / 'onnx_model.py'}:not_a_model"
    bad_factory = run_cli(
        "export", "onnx", str(tmp_path / "w.pt"), "--model", factory, "--input-shape", "1,3"
    )
    assert bad_factory.code == 2 and "not a Module" in bad_factory.stderr
    factory = f"{SCRIPTS / 'onnx_model.py'}:build_cnn"
    no_ckpt = run_cli(
        "export", "onnx", str(tmp_path / "missing"), "--model", factory, "--input-shape", "1,3,8,8"
    )
    assert no_ckpt.code == 2 and "not found" in no_ckpt.stderr
