"""Two processes under torchrun (gloo on CPU) against one process with the same
global batch; per-rank exact resume; FSDP2; an OOM on one rank only."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _train_scripts import tiny
from cloudtrain.runtime import load_checkpoint
from cloudtrain.store import RunStore

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "_train_scripts" / "tiny.py"
STEPS = 10


def _torchrun(*args: str, nproc: int = 2) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--standalone",
        str(SCRIPT),
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    # one JSON object per rank; ranks share stdout, so lines can run together
    return [json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", done.stdout)]


def _start_ranks(*args: str, nproc: int = 2) -> list[tuple[int, str, str]]:
    """The environment torchrun gives its workers, without the agent (seconds faster):
    (exit code, stdout, stderr) of every rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONFAULTHANDLER": "1",  # a crash (SIGABRT/SIGSEGV) prints every thread's stack
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    finished = [proc.communicate(timeout=180) for proc in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, finished, strict=True)]


def _launch(*args: str, nproc: int = 2) -> list[dict]:
    """Every rank's result line; fails with every rank's stderr unless all exit 0 (one
    rank's crash often surfaces as another's error)."""
    ranks = _start_ranks(*args, nproc=nproc)
    report = "\n".join(
        f"--- rank {r} (rc {code}):\n{err[-1500:]}" for r, (code, _, err) in enumerate(ranks)
    )
    assert [code for code, _, _ in ranks] == [0] * nproc, report
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in ranks]


def _single(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _load(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("one") / "params.pt"
    _single("--plain", "--steps", str(STEPS), "--micro", "4", "--params-out", str(out))
    return _load(out)


def _close(a: dict, b: dict) -> None:
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_ddp_two_processes_equal_one_process(tmp_path, one_process):
    # each rank: 4 samples per step as 2 micro-batches of 2 (no_sync on the first)
    out = tmp_path / "params.pt"
    _torchrun("--plain", "--steps", str(STEPS), "--micro", "2", "--params-out", str(out))
    _close(_load(out), one_process)


def test_fsdp2_two_processes_with_a_resume_equal_one_process(tmp_path, one_process):
    common = ["--plain", "--micro", "2", "--parallelism", "fsdp", "--ckpt", str(tmp_path / "c")]
    _launch(*common, "--steps", "6")
    # each rank wrote its own shards through DCP; nothing was gathered on rank 0
    step_dir = tmp_path / "c" / "step_000000006"
    loaded = load_checkpoint(step_dir)
    assert loaded.state["model"] is None and loaded.state["optimizer"] is None
    assert loaded.sharded_path == step_dir / "sharded"
    files = json.loads((step_dir / "manifest.json").read_text())["files"]
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(files)
    whole = loaded.model_state()  # one process reads every rank's shards
    assert set(whole) == set(one_process) and whole["body.0.weight"].shape == (32, 6)
    # DCP reshards: one process resumes the two ranks' checkpoint
    shutil.copytree(tmp_path / "c", tmp_path / "c1")
    alone = tmp_path / "alone.pt"
    _single("--plain", "--micro", "2", "--ckpt", str(tmp_path / "c1"), "--steps", str(STEPS),
            "--params-out", str(alone))  # fmt: skip
    _close(_load(alone), one_process)
    out = tmp_path / "params.pt"
    _launch(*common, "--steps", str(STEPS), "--params-out", str(out))
    _close(_load(out), one_process)
    # and the resume is exact: bit for bit what FSDP computes without stopping
    straight = tmp_path / "straight.pt"
    _launch(*common[:-1], str(tmp_path / "s"), "--steps", str(STEPS), "--params-out", str(straight))
    a, b = _load(out), _load(straight)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ddp_resume_restores_every_ranks_rng_exactly(tmp_path):
    # dropout and RNG in the loss differ per rank: a resume must restore each rank's state
    straight = tmp_path / "straight.pt"
    _launch(
        "--steps",
        str(STEPS),
        "--micro",
        "2",
        "--params-out",
        str(straight),
        "--loss-log",
        str(tmp_path / "a"),
    )
    common = ["--micro", "2", "--ckpt", str(tmp_path / "c"), "--loss-log", str(tmp_path / "b")]
    _launch(*common, "--steps", "4")
    resumed = tmp_path / "resumed.pt"
    _launch(*common, "--steps", str(STEPS), "--params-out", str(resumed))
    a, b = _load(straight), _load(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert tiny.read_losses(tmp_path / "a") == tiny.read_losses(tmp_path / "b")


def test_oom_on_one_rank_shrinks_every_rank(tmp_path):
    out = tmp_path / "params.pt"
    # global 16 -> 8 per rank as micro-batches of 4; rank 1 alone hits a limit of 2
    results = _launch(
        "--plain",
        "--global-batch",
        "16",
        "--micro",
        "4",
        "--oom-at",
        "1:3:2",
        "--steps",
        "6",
        "--params-out",
        str(out),
    )
    assert [r["micro"] for r in results] == [2, 2]
    reference = tmp_path / "ref.pt"
    _single(
        "--plain",
        "--global-batch",
        "16",
        "--micro",
        "8",
        "--steps",
        "6",
        "--params-out",
        str(reference),
    )
    _close(_load(out), _load(reference))


def test_every_rank_has_step_records_at_log_steps(tmp_path):
    db = tmp_path / "runs.db"
    results = _launch("--plain", "--steps", "5", "--store", str(db), "--log-every", "2")
    run_id = results[0]["run_id"]
    assert run_id and results[1]["run_id"] is None  # only rank 0 records
    with RunStore.open(db) as store:
        steps = store.steps(run_id)
        config = store.get_run(run_id).config
    by_rank = {r: [s.step for s in steps if s.rank == r] for r in (0, 1)}
    assert by_rank == {0: [2, 4, 5], 1: [2, 4, 5]}  # the last step off the grid too
    assert all(s.step_s > 0 and s.data_wait_s is not None for s in steps)
    assert config["world_size"] == 2 and config["parallelism"] == "ddp"


def test_ranks_agree_once_per_step_including_timed_checkpoints(tmp_path):
    """Stop flags, the checkpoint clock and the OOM check share one host-side
    all_reduce per step; time-based checkpoints land on the same step on every rank."""
    results = _launch(
        "--plain",
        "--steps",
        "8",
        "--log-every",
        "100",
        "--ckpt",
        str(tmp_path / "ckpt"),
        "--every-seconds",
        "0.01",
        "--count-all-reduce",
    )
    for result in results:
        assert result["stopped_by"] == "max_steps"
        # the first step also carries setup (micro-batch size, the first stop check)
        assert result["all_reduce_per_step"][1:] == [1] * 7
    assert results[0]["checkpoint"] == results[1]["checkpoint"]
    assert load_checkpoint(results[0]["checkpoint"]).step == 8


def test_host_agreements_use_the_default_group_when_it_is_gloo(tmp_path):
    import torch.distributed as dist

    from cloudtrain.runtime import distributed as D

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        assert D.host_plane().group is None  # gloo carries CPU tensors: no second group
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_process_14_steps(tmp_path_factory) -> dict[str, torch.Tensor]:
    """PowerSGD compresses from its 10th step on, so the runs go past it."""
    out = tmp_path_factory.mktemp("one14") / "params.pt"
    _single("--plain", "--steps", "14", "--micro", "4", "--params-out", str(out))
    return _load(out)


@pytest.mark.parametrize(("kind", "at_most"), [("fp16", 1e-3), ("powersgd", 5e-2)])
def test_gradient_compression_changes_the_gradients_a_little(
    tmp_path, one_process_14_steps, kind, at_most
):
    """The hook really runs (parameters differ from the uncompressed run, which equals
    one process exactly) and training stays close (fp16 rounding; PowerSGD's rank-2
    approximation with error feedback)."""
    out = tmp_path / "params.pt"
    _launch("--plain", "--steps", "14", "--grad-compression", kind, "--params-out", str(out))
    params = _load(out)
    gap = max((params[k] - one_process_14_steps[k]).abs().max().item() for k in params)
    assert 0 < gap < at_most


def test_bf16_compression_on_gloo_is_a_user_error(tmp_path):
    import torch.distributed as dist

    from cloudtrain.errors import UserError
    from cloudtrain.runtime import distributed as D

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        with pytest.raises(UserError, match="needs NCCL"):
            D.wrap_ddp(torch.nn.Linear(2, 2), torch.device("cpu"), "bf16")
    finally:
        dist.destroy_process_group()


def test_a_parameter_the_loss_never_reaches_needs_find_unused_parameters(tmp_path):
    """Without the flag: one line that names the TrainConfig field; with it: the same
    training as one process."""
    args = ("--plain", "--steps", "4", "--unused-param")
    failed = _start_ranks(*args)
    assert all(code != 0 for code, _, _ in failed)
    assert all("TrainConfig(find_unused_parameters=True)" in err for _, _, err in failed)
    out, reference = tmp_path / "ddp.pt", tmp_path / "one.pt"
    _launch(*args, "--find-unused", "--params-out", str(out))
    _single(*args, "--params-out", str(reference))
    _close(_load(out), _load(reference))


def test_the_straggler_is_the_rank_the_others_wait_for(tmp_path):
    """Rank 1 sleeps 40 ms per micro-batch: synchronous steps take equally long on both
    ranks, but rank 0 waits at the per-step agreement, and diagnose names rank 1."""
    from cloudtrain.diagnose import rules_system
    from cloudtrain.diagnose.run import load_run_data
    from cloudtrain.store import SYNC_WAIT_KEY

    db = tmp_path / "runs.db"
    results = _launch("--plain", "--steps", "6", "--global-batch", "16", "--micro", "4",
                      "--store", str(db), "--log-every", "2", "--slow-rank", "1:40")  # fmt: skip
    with RunStore.open(db) as store:
        data = load_run_data(store, results[0]["run_id"])
    waits = {r: [s.metrics[SYNC_WAIT_KEY] for s in data.steps if s.rank == r] for r in (0, 1)}
    assert min(waits[0]) > 0.02 > max(waits[1])  # rank 0 waits for rank 1's first micro-batch
    finding = rules_system.stragglers(data)
    assert finding is not None and finding.data["who"] == "rank 1"


def test_powersgd_resumes_bit_identical(tmp_path):
    """PowerSGD compresses from step 10 on; a cut at step 12 keeps its error feedback,
    warm-start matrices and RNG in each rank's checkpoint, so the resumed run ends
    exactly where the uncut one does."""
    args = ("--plain", "--steps", "16", "--grad-compression", "powersgd")
    straight, resumed = tmp_path / "straight.pt", tmp_path / "resumed.pt"
    _launch(*args, "--params-out", str(straight))
    cut = [a if a != "16" else "12" for a in args]
    _launch(*cut, "--ckpt", str(tmp_path / "ck"))
    _launch(*args, "--ckpt", str(tmp_path / "ck"), "--params-out", str(resumed))
    a, b = _load(straight), _load(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_three_ranks_resume_bit_identical(tmp_path):
    """With more than two ranks the order gradients are summed in depends on DDP's
    bucket layout, which differs in a fresh DDP's first step: a resume settles the
    layout first, so the resumed run sums as the uncut one did."""
    args = ("--global-batch", "12", "--micro", "4")
    straight, resumed = tmp_path / "straight.pt", tmp_path / "resumed.pt"
    _launch(*args, "--steps", "10", "--params-out", str(straight), nproc=3)
    _launch(*args, "--steps", "5", "--ckpt", str(tmp_path / "ck"), nproc=3)
    _launch(*args, "--steps", "10", "--ckpt", str(tmp_path / "ck"), "--params-out", str(resumed),
            nproc=3)  # fmt: skip
    a, b = _load(straight), _load(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
