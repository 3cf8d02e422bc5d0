"""`cloudtrain run`: supervise a training script under torchrun.

torchrun (`python -m torch.distributed.run`, the elastic agent, run through
`cloudtrain.launch._torchrun` so that a stop we ask for ends without torchrun's
SignalException traceback) starts and watches the worker processes, forwards
signals to them and, in elastic multi-node mode, restarts them on membership changes.
Around it the supervisor adds what torchrun does not have:

- one run in the store, with every launch of torchrun recorded as an attempt
  (exit code, reason, spend) and events for restarts, preemption and budget;
- restart with exponential backoff after a failure, up to `max_restarts` times; the
  script resumes from its latest checkpoint in CLOUDTRAIN_CHECKPOINT_DIR;
- SIGTERM/SIGINT to the supervisor (a preemption notice) is forwarded to torchrun,
  which forwards it to the workers as a checkpoint request and kills them only
  after `grace_s` (torchrun's --shutdown-timeout);
- a budget: spend (price x wall time, summed over attempts) projected to exceed it
  by the next check plus the grace period stops the job with a checkpoint.

Exit codes of `cloudtrain run` (EXIT_*): 0 the script finished; 1 it failed after all
restarts; 2 a usage error; 3 stopped by the budget (a checkpoint is there: run again
to resume; the budget counts per run); 75 stopped by SIGTERM/SIGINT after the workers
checkpointed (run again to resume; the Trainer exits with the same 75). On a stop
`summary_line` says in one line what stopped the run, after how long, where the
checkpoints are and the command that resumes it (`resume_command`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cloudtrain.errors import UserError
from cloudtrain.launch.recorder import RunRecorder
from cloudtrain.launch.worker import worker_args

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BUDGET = 3
EXIT_INTERRUPTED = 75
CHECKPOINT_ENV = "CLOUDTRAIN_CHECKPOINT_DIR"
RUN_ID_ENV = "CLOUDTRAIN_RUN_ID"
ATTEMPT_ENV = "CLOUDTRAIN_ATTEMPT"
GRACE_ENV = "CLOUDTRAIN_GRACE_S"
MTBF_ENV = "CLOUDTRAIN_MTBF_S"
"""Expected seconds between interruptions of the job; the Trainer's default `mtbf_s`."""
NODE_PRICE_ENV = "CLOUDTRAIN_NODE_PRICE_USD_PER_HOUR"
"""Price of one node; the Trainer's default price is this times the number of nodes."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
TORCHRUN_MODULE = "cloudtrain.launch._torchrun"
"""torchrun (torch.distributed.run) minus the traceback on a stop signal; see that module."""


TEARDOWN_S = 1.0
"""Seconds from the workers' exit to torchrun's (its agent shutting down, the workers'
interpreters exiting): 0.5 s measured after a budget stop on a 2-core machine, where a
budget that left no room for it was overshot by that much."""


@dataclass(frozen=True)
class RunSpec:
    """A supervised run. Validated at construction; every None says what it means."""

    command: tuple[str, ...]
    """Training script and its arguments."""
    nproc: int | str = 1
    """Worker processes on this node, or "auto": one per CUDA GPU (1 without GPUs)."""
    nnodes: str | None = None
    """"N" or "MIN:MAX" nodes for a multi-node elastic job; None: this node alone."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous; required with `nnodes`."""
    rdzv_id: str | None = None
    """Rendezvous id, equal on every node; None: derived from name and command."""
    max_restarts: int = 3
    budget_usd: float | None = None
    """Stop (with a checkpoint) before spend would exceed this; None: no budget."""
    price_usd_per_hour: float | None = None
    """Price of this machine; needed for a budget; None: spend is not counted."""
    grace_s: float = 30.0
    """Time workers get from the checkpoint request to exit before they are killed."""
    backoff_s: float = 5.0
    """Wait before the first restart; doubled for each further one."""
    backoff_max_s: float = 300.0
    checkpoint_dir: str = "checkpoints"
    """Handed to the script as CLOUDTRAIN_CHECKPOINT_DIR (made absolute)."""
    name: str | None = None
    """Run name in the store; None: a generated one."""
    poll_s: float = 0.5
    """How often the supervisor checks the job and the budget."""
    env: dict[str, str] = field(default_factory=dict)
    mtbf_s: float | None = None
    """Expected seconds between interruptions of the job, handed to the script as
    CLOUDTRAIN_MTBF_S (the Trainer's "auto" checkpoint interval uses it); None: unset."""
    offer: dict[str, Any] | None = None
    """The catalog offer this machine is (provider, region, instance_type, pricing, gpu,
    gpu_count), recorded with the run so reports know its region's carbon intensity
    and its provider's PUE; None: not given."""

    def __post_init__(self) -> None:
        if not self.command:
            raise UserError("no training command; give it after `--`: cloudtrain run -- train.py")
        worker_args(self.command)  # a command torchrun cannot run is an error now, not later
        if self.nproc != "auto" and (not isinstance(self.nproc, int) or self.nproc < 1):
            raise UserError(f"--nproc must be a positive integer or 'auto', got {self.nproc!r}")
        if (self.nnodes is None) != (self.rdzv_endpoint is None):
            raise UserError("--nnodes and --rdzv go together (e.g. --nnodes 1:4 --rdzv host:29400)")
        if self.max_restarts < 0 or self.grace_s <= 0 or self.backoff_s < 0 or self.poll_s <= 0:
            raise UserError("need --max-restarts >= 0, --grace-s > 0 and --backoff-s >= 0")
        if self.budget_usd is not None and self.price_usd_per_hour is None:
            raise UserError("--budget needs --price (USD per hour of this machine)")
        if self.price_usd_per_hour is not None and self.price_usd_per_hour < 0:
            raise UserError("--price must be >= 0")
        if self.budget_usd is not None and self.budget_usd <= 0:
            raise UserError("--budget must be > 0")
        if self.mtbf_s is not None and not 0 < self.mtbf_s < math.inf:
            raise UserError(f"--mtbf-hours must be > 0, got {self.mtbf_s / 3600:g}")


@dataclass(frozen=True)
class AttemptOutcome:
    attempt: int
    exit_code: int
    reason: str
    """"completed", "crash", "preempted" (stop signal) or "budget"."""
    duration_s: float
    spend_usd: float | None


@dataclass(frozen=True)
class RunOutcome:
    """What `supervise` returns; `exit_code` is what `cloudtrain run` exits with."""

    run_id: str
    status: str
    exit_code: int
    attempts: tuple[AttemptOutcome, ...]
    spend_usd: float | None
    """Summed over attempts; None without a price."""
    checkpoint_dir: str
    duration_s: float = 0.0
    """Wall time of the whole run: attempts and the waits between them."""
    stopped_by: str | None = None
    """"budget", or the stop signal ("SIGTERM", "SIGINT"); None: not stopped."""
    resume_command: str | None = None
    """The `cloudtrain run` line that resumes a stopped run; None: not stopped."""


def mtbf_s_from_band(band: str, nodes: int = 1) -> float:
    """Expected seconds between interruptions of a job on `nodes` spot nodes of an AWS
    interruption-frequency band ("<5%", "5-10%", ...).

    The band's mid-point f (INTERRUPTION_BANDS) is read as the share of nodes interrupted
    within a month (730 h), as the planner does: a constant hazard per node-hour
    h = -ln(1 - f) / 730 (plan.cost.hazard_per_node_hour), so one node's MTBF is 1 / h
    hours, e.g. "<5%" (f = 0.025) gives 28,800 h and ">20%" (f = 0.25) 2,540 h. Any node's
    interruption stops the job, so a job's MTBF is 1 / (h * nodes).
    """
    from cloudtrain.catalog.types import INTERRUPTION_BANDS
    from cloudtrain.errors import UnknownNameError
    from cloudtrain.plan.cost import hazard_per_node_hour

    if band not in INTERRUPTION_BANDS:
        raise UnknownNameError("interruption band", band, INTERRUPTION_BANDS)
    if nodes < 1:
        raise UserError(f"nodes must be >= 1, got {nodes}")
    hazard_per_hour = hazard_per_node_hour(INTERRUPTION_BANDS[band]) * nodes
    return 3600.0 / hazard_per_hour


def max_nodes(nnodes: str | None) -> int:
    """The most nodes `--nnodes` ("N" or "MIN:MAX") allows; 1 without it."""
    if not nnodes:
        return 1
    try:
        return int(nnodes.split(":")[-1])
    except ValueError:
        raise UserError(f"--nnodes must be N or MIN:MAX, got '{nnodes}'") from None


def resolve_nproc(nproc: int | str) -> int:
    """Workers per node: "auto" is the CUDA device count, or 1 without CUDA."""
    if nproc != "auto":
        return int(nproc)
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:
        return 1


def torchrun_command(spec: RunSpec, run_key: str) -> list[str]:
    """The torchrun invocation for one attempt."""
    cmd = [sys.executable, "-m", TORCHRUN_MODULE]
    cmd += [f"--nproc-per-node={resolve_nproc(spec.nproc)}"]
    if spec.nnodes is None:
        cmd += ["--standalone", "--max-restarts=0"]
    else:
        rdzv_id = spec.rdzv_id or run_key
        cmd += [f"--nnodes={spec.nnodes}", "--rdzv-backend=c10d"]
        cmd += [f"--rdzv-endpoint={spec.rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
        cmd += [f"--max-restarts={spec.max_restarts}"]
    cmd += [f"--shutdown-timeout={max(1, round(spec.grace_s))}"]
    return [*cmd, *worker_args(spec.command)]


def run_key(spec: RunSpec) -> str:
    """A stable id for the job (same on every node): name, else a hash of the command."""
    if spec.name:
        return spec.name
    return "ct-" + hashlib.sha1("\0".join(spec.command).encode()).hexdigest()[:12]


class _Stopper:
    """Remembers a stop signal sent to the supervisor; wakes sleepers."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.wake = threading.Event()

    def handle(self, signum: int, frame: Any) -> None:
        self.signal = signum
        self.wake.set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Supervisor:
    """Runs `spec` to completion, restart, budget stop or stop signal."""

    def __init__(
        self,
        spec: RunSpec,
        recorder: RunRecorder,
        *,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.recorder = recorder
        self.say = say or (
            lambda line: print(f"cloudtrain run: {line}", file=sys.stderr, flush=True)
        )
        self.stopper = _Stopper()
        self.checkpoint_dir = str(Path(spec.checkpoint_dir).expanduser().resolve())
        self.spent_usd = 0.0

    # -- accounting ---------------------------------------------------------------

    def _spend(self, seconds: float) -> float:
        price = self.spec.price_usd_per_hour
        return 0.0 if price is None else price * seconds / 3600.0

    def _over_budget(self, elapsed_s: float) -> bool:
        """Would spend exceed the budget by the next check, the grace period and torchrun's
        teardown?"""
        if self.spec.budget_usd is None:
            return False
        ahead_s = elapsed_s + self.spec.poll_s + self.spec.grace_s + TEARDOWN_S
        return self.spent_usd + self._spend(ahead_s) > self.spec.budget_usd

    # -- one attempt --------------------------------------------------------------

    def _env(self, attempt: int) -> dict[str, str]:
        env = {**os.environ, **self.spec.env}
        env[CHECKPOINT_ENV] = self.checkpoint_dir
        env[RUN_ID_ENV] = self.recorder.run_id
        env[ATTEMPT_ENV] = str(attempt)
        env[GRACE_ENV] = f"{self.spec.grace_s:g}"
        if self.spec.mtbf_s is not None:
            env[MTBF_ENV] = repr(float(self.spec.mtbf_s))
        if self.spec.price_usd_per_hour is not None:
            env[NODE_PRICE_ENV] = repr(float(self.spec.price_usd_per_hour))
        return env

    def _stop(self, proc: subprocess.Popen[bytes]) -> int:
        """Ask torchrun to stop (it forwards SIGTERM to the workers); kill after the grace."""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=self.spec.grace_s + 10.0)
        except subprocess.TimeoutExpired:
            self.say(f"torchrun did not exit {self.spec.grace_s:g} s after SIGTERM; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()

    def _watch(self, proc: subprocess.Popen[bytes], started: float) -> tuple[int, str | None]:
        """Wait for torchrun; stop it on a signal or the budget. (exit code, stop reason)."""
        while True:
            try:
                return proc.wait(timeout=self.spec.poll_s), None
            except subprocess.TimeoutExpired:
                pass
            elapsed_s = time.monotonic() - started
            if self.stopper.signal is not None:
                reason, cause = "preempted", signal.Signals(self.stopper.signal).name
                self.recorder.preemption(self.stopper.signal, self.spec.grace_s)
            elif self._over_budget(elapsed_s):
                reason = cause = "budget"
                spend = self.spent_usd + self._spend(elapsed_s)
                self.recorder.budget(spend, self.spec.budget_usd)
            else:
                continue
            self.say(f"{cause}: asking the workers to checkpoint (grace {self.spec.grace_s:g} s)")
            return self._stop(proc), reason

    def run_attempt(self, attempt: int, run_key_: str) -> AttemptOutcome:
        cmd = torchrun_command(self.spec, run_key_)
        started = time.monotonic()
        self.recorder.attempt_started(attempt)
        proc = subprocess.Popen(cmd, env=self._env(attempt), start_new_session=True)
        try:
            code, reason = self._watch(proc, started)
        except BaseException:
            if proc.poll() is None:  # never leave torchrun and its workers behind
                self._stop(proc)
            raise
        duration = time.monotonic() - started
        spend = self._spend(duration) if self.spec.price_usd_per_hour is not None else None
        self.spent_usd += spend or 0.0
        reason = reason or ("completed" if code == 0 else "crash")
        outcome = AttemptOutcome(attempt, code, reason, duration, spend)
        self.recorder.attempt_ended(outcome)
        return outcome

    # -- the whole run -------------------------------------------------------------

    def _backoff_s(self, restart: int) -> float:
        return min(self.spec.backoff_s * 2 ** (restart - 1), self.spec.backoff_max_s)

    def run(self) -> RunOutcome:
        key = run_key(self.spec)
        outcomes: list[AttemptOutcome] = []
        started = time.monotonic()
        with self.stopper.installed():
            status, exit_code = self._loop(key, outcomes)
        spend = self.spent_usd if self.spec.price_usd_per_hour is not None else None
        stopped_by = None
        if exit_code == EXIT_BUDGET:
            stopped_by = "budget"
        elif exit_code == EXIT_INTERRUPTED and self.stopper.signal is not None:
            stopped_by = signal.Signals(self.stopper.signal).name
        outcome = RunOutcome(
            self.recorder.run_id, status, exit_code, tuple(outcomes), spend, self.checkpoint_dir,
            duration_s=time.monotonic() - started, stopped_by=stopped_by,
            resume_command=None if stopped_by is None else resume_command(self.spec),
        )  # fmt: skip
        self.recorder.finished(outcome)
        return outcome

    def _loop(self, key: str, outcomes: list[AttemptOutcome]) -> tuple[str, int]:
        for attempt in range(1, self.spec.max_restarts + 2):
            if self.stopper.signal is not None:
                return "preempted", EXIT_INTERRUPTED
            if self._over_budget(0.0):
                self.say("budget reached before the next attempt; stopping")
                return "stopped", EXIT_BUDGET
            outcome = self.run_attempt(attempt, key)
            outcomes.append(outcome)
            if outcome.reason == "completed":
                return "completed", EXIT_OK
            if outcome.reason == "budget":
                return "stopped", EXIT_BUDGET
            if outcome.reason == "preempted":
                return "preempted", EXIT_INTERRUPTED
            if attempt > self.spec.max_restarts:
                break
            backoff = self._backoff_s(attempt)
            self.say(f"attempt {attempt} exited with {outcome.exit_code}; restart in {backoff:g} s")
            self.recorder.restart(attempt + 1, outcome.exit_code, backoff)
            if self.stopper.wake.wait(backoff):
                return "preempted", EXIT_INTERRUPTED
        self.say(f"giving up after {self.spec.max_restarts} restart(s)")
        return "failed", EXIT_FAILED


def supervise(
    spec: RunSpec, *, store_path: str | Path | None = None, say: Callable[[str], None] | None = None
) -> RunOutcome:
    """Run `spec` under torchrun with restarts, budget and signal handling; see module doc."""
    with RunRecorder.open(spec_config(spec), store_path=store_path) as recorder:
        return Supervisor(spec, recorder, say=say).run()


def spec_config(spec: RunSpec) -> dict[str, Any]:
    """The spec as plain values, for the run's config in the store."""
    return asdict(spec)


def resume_command(spec: RunSpec) -> str:
    """The `cloudtrain run` line that runs `spec` again (shell-quoted); the script resumes
    from the checkpoints in its (absolute) checkpoint directory. Values that came from
    the settings are written out; the budget is per run, so the same `--budget` allows
    that much more spend."""
    args = ["cloudtrain", "run"]
    if spec.nproc != 1:
        args += ["--nproc", str(spec.nproc)]
    if spec.nnodes is not None and spec.rdzv_endpoint is not None:
        args += ["--nnodes", spec.nnodes, "--rdzv", spec.rdzv_endpoint]
    defaults = RunSpec(command=spec.command)
    if spec.max_restarts != defaults.max_restarts:
        args += ["--max-restarts", str(spec.max_restarts)]
    if spec.price_usd_per_hour is not None:
        args += ["--price", _number(spec.price_usd_per_hour)]
    if spec.budget_usd is not None:
        args += ["--budget", _number(spec.budget_usd)]
    if spec.grace_s != defaults.grace_s:
        args += ["--grace-s", _number(spec.grace_s)]
    if spec.backoff_s != defaults.backoff_s:
        args += ["--backoff-s", _number(spec.backoff_s)]
    args += ["--checkpoint-dir", str(Path(spec.checkpoint_dir).expanduser().resolve())]
    if spec.name is not None:
        args += ["--name", spec.name]
    if spec.mtbf_s is not None:
        args += ["--mtbf-hours", f"{spec.mtbf_s / 3600:.6g}"]
    return shlex.join([*args, "--", *spec.command])


def _number(value: float) -> str:
    """`value` for a command line: short, and exact to 12 significant digits."""
    return f"{value:.12g}"


def format_duration(seconds: float) -> str:
    """A duration for people: "7.5 s", "12 min 5 s", "3 h 07 min"."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def summary_line(outcome: RunOutcome, budget_usd: float | None = None) -> str:
    """One line on how the run ended; on a stop: what stopped it, after how long, where
    the checkpoints are and how to resume. `budget_usd`: the run's budget, shown on a
    budget stop; None: not shown."""
    count = len(outcome.attempts)
    facts = f"run {outcome.run_id}, {count} attempt{'' if count == 1 else 's'}"
    if outcome.spend_usd is not None:
        facts += f", spend {outcome.spend_usd:.2f}"
        if outcome.stopped_by == "budget" and budget_usd is not None:
            facts += f" of {budget_usd:g}"
        facts += " USD"
    took = format_duration(outcome.duration_s)
    if outcome.stopped_by is None:
        return (
            f"{outcome.status} after {took} ({facts}); "
            f"CLOUDTRAIN_CHECKPOINT_DIR was {outcome.checkpoint_dir}"
        )
    cause = "the budget" if outcome.stopped_by == "budget" else outcome.stopped_by
    return (
        f"stopped by {cause} after {took} ({facts}); checkpoints in "
        f"{outcome.checkpoint_dir}; resume with: {outcome.resume_command}"
    )
