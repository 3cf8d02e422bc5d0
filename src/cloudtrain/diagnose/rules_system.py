"""Rules about what went wrong around the GPU: OOM adjustments, throttling, stalls,
communication-bound steps and stragglers among ranks or GPUs."""

from __future__ import annotations

import itertools
import re

from cloudtrain.diagnose.data import RunData, comm_s, mean, median, share, sync_wait_s
from cloudtrain.diagnose.rules import _finding
from cloudtrain.monitor.snapshots import SLOWDOWN_MASK, THERMAL_MASK, throttle_names
from cloudtrain.store import Finding

THROTTLED_SHARE = 0.10
"""Share of busy samples with a slowdown reason above which throttling is reported."""
STALL_GAP_S = 60.0
STALL_GAP_STEPS = 10.0
"""A gap between steps longer than max(STALL_GAP_S, 10 x the median step interval) is a stall."""
COMM_SHARE = 0.25
STRAGGLER_RATIO = 1.15
GPU_UTIL_SPREAD_PCT = 25.0


def oom_adjustments(data: RunData) -> Finding | None:
    events = [e for e in data.events if e.kind == "oom_adjustment"]
    if not events:
        return None
    changes = []
    for e in events:
        old = e.data.get("old_micro_batch", e.data.get("old"))
        new = e.data.get("new_micro_batch", e.data.get("new"))
        if old is not None and new is not None:
            changes.append(f"{old}->{new}")
    path = f" (micro-batch {', '.join(changes)})" if changes else ""
    return _finding(
        data,
        "oom_adjustments",
        "warn",
        symptom=f"ran out of GPU memory {len(events)} time(s){path}",
        evidence=f"{len(events)} oom_adjustment event(s); first at step "
        f"{events[0].data.get('step', '?')}; peak memory "
        f"{(data.memory_peak_fraction() or 0):.0%} of the GPU",
        cause="activations (growing with micro-batch and sequence length), fragmentation, or "
        "a memory spike (long batch, evaluation) exceeded the GPU's memory",
        fix="start from the micro-batch that fitted and keep the global batch with gradient "
        "accumulation; turn on activation checkpointing; bf16; set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; shard "
        "optimizer state (FSDP/ZeRO) on several GPUs",
        expected_gain="no steps lost to OOM retries; a stable micro-batch",
        data={"count": len(events), "changes": changes},
    )


def _throttle_counts(data: RunData) -> dict[int, tuple[int, int, bool, list[float]]]:
    """Per GPU: (busy samples, throttled samples, any thermal, clock/max while throttled)."""
    out = {}
    for i in data.gpu_indices():
        busy, slowed, thermal, clocks = 0, 0, False, []
        for sample in data.samples:
            util = sample.metrics.get(f"gpu/{i}/util_pct")
            mask = sample.metrics.get(f"gpu/{i}/throttle_reasons")
            if util is None or util < 50 or mask is None:
                continue
            busy += 1
            if int(mask) & SLOWDOWN_MASK:
                slowed += 1
                thermal = thermal or bool(int(mask) & THERMAL_MASK)
                clock = sample.metrics.get(f"gpu/{i}/sm_clock_mhz")
                top = sample.metrics.get(f"gpu/{i}/sm_clock_max_mhz")
                if clock and top:
                    clocks.append(clock / top)
        out[i] = (busy, slowed, thermal, clocks)
    return out


def _reasons(data: RunData, gpus: list[int]) -> list[str]:
    found: set[str] = set()
    for i in gpus:
        for mask in data.series(f"gpu/{i}/throttle_reasons"):
            found.update(throttle_names(int(mask)))
    return sorted(found)


def throttling(data: RunData) -> Finding | None:
    counts = _throttle_counts(data)
    hit = [
        i for i, (busy, slowed, _, _) in counts.items() if busy and slowed / busy >= THROTTLED_SHARE
    ]
    if not hit:
        return None
    worst = max(hit, key=lambda i: counts[i][1] / counts[i][0])
    busy, slowed, _, _ = counts[worst]
    thermal = any(counts[i][2] for i in hit)
    ratio = mean(c for i in hit for c in counts[i][3])
    temps = [v for i in hit for v in data.series(f"gpu/{i}/temperature_c")]
    hot = f"; max temperature {max(temps):.0f} C" if temps else ""
    clock_text = f"; SM clock at {ratio:.0%} of max while throttled" if ratio else ""
    reasons = _reasons(data, hit)
    return _finding(
        data,
        "throttling",
        "warn",
        symptom=f"GPU {', '.join(map(str, hit))} throttled ({', '.join(reasons)})",
        evidence=f"GPU {worst}: {slowed} of {busy} busy samples ({slowed / busy:.0%}) with "
        f"slowdown reasons{clock_text}{hot}",
        cause="the GPU is too hot (cooling, airflow, a hot chassis)"
        if thermal
        else "the GPU hits its power limit",
        fix="check fans and inlet temperature, and the power limit (nvidia-smi -q -d "
        "PERFORMANCE,POWER); on a rented machine ask for another host; a power cap set "
        "below the default (nvidia-smi -pl) costs speed",
        expected_gain=f"up to {1 / ratio:.2f}x on compute-bound kernels"
        if ratio
        else "back to full clocks",
        data={
            "gpus": hit,
            "throttled_share": slowed / busy,
            "clock_ratio": ratio,
            "reasons": reasons,
        },
    )


_STACK_HINTS = (
    (
        re.compile(r"all_reduce|all_gather|reduce_scatter|broadcast|barrier|nccl", re.I),
        "a collective (NCCL) waits: a rank died, hangs, or ranks called collectives in a "
        "different order",
    ),
    (
        re.compile(r"synchronize|\.item|\.cpu\(|cuda.*wait", re.I),
        "the host waits on the GPU: a CUDA kernel hang",
    ),
    (
        re.compile(r"_next_data|dataloader|queue\.get|_recv", re.I),
        "a DataLoader worker hangs or died (shared memory, a stuck file read)",
    ),
)


def _stall_cause(stacks: str | None) -> str:
    for pattern, cause in _STACK_HINTS:
        if stacks and pattern.search(stacks):
            return cause
    return (
        "a CUDA kernel hang, an NCCL collective waiting for a rank, or a hung DataLoader "
        "worker (record stacks: enable_stack_dumps)"
    )


def stall(data: RunData) -> Finding | None:
    events = [e for e in data.events if e.kind == "stall"]
    steps = sorted(
        ([s for s in data.steps if s.rank == 0] or data.steps), key=lambda s: s.time_unix_s
    )
    gaps = [(b.time_unix_s - a.time_unix_s, a.step) for a, b in itertools.pairwise(steps)]
    typical = median(g for g, _ in gaps) or 0.0
    limit = max(STALL_GAP_S, STALL_GAP_STEPS * typical)
    long = [(g, step) for g, step in gaps if g > limit]
    if not events and not long:
        return None
    stacks = next((e.data.get("stacks") for e in events if e.data.get("stacks")), None)
    parts = [f"{len(events)} stall alert(s)"] if events else []
    if long:
        gap, at = max(long)
        parts.append(f"longest gap {gap:.0f} s after step {at} (typical {typical:.1f} s)")
    return _finding(
        data,
        "stall",
        "critical",
        symptom="training stopped making progress" + (" and recovered" if long else ""),
        evidence="; ".join(parts) + ("; stack dump recorded" if stacks else ""),
        cause=_stall_cause(stacks),
        fix="read the stack dump (cloudtrain report shows it); for NCCL: NCCL_DEBUG=INFO and "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 with a collective timeout "
        "(init_process_group(timeout=...)) so a hang becomes an error and a restart; for "
        "kernel hangs: CUDA_LAUNCH_BLOCKING=1 on a reproduction; set the watchdog's stall_s",
        expected_gain="no hours billed for a hung job",
        data={"stall_events": len(events), "gaps_s": [g for g, _ in long]},
    )


def communication_bound(data: RunData) -> Finding | None:
    if max(len(data.ranks), data.run.gpu_count or 0) < 2:
        return None
    steps = data.main_steps
    comm = share([(comm_s(s), s.step_s) for s in steps])
    if comm is None or comm < COMM_SHARE:
        return None
    compression = data.config_value("grad_compression")
    return _finding(
        data,
        "communication_bound",
        "critical" if comm >= 0.5 else "warn",
        symptom=f"{comm:.0%} of each step waits on gradient communication",
        evidence=f"non-overlapped collective time {comm:.0%} of step time over {len(steps)} "
        f"steps on {max(len(data.ranks), data.run.gpu_count)} GPUs; gradient compression "
        f"{compression or 'off'}",
        cause="the interconnect (PCIe without NVLink, TCP instead of InfiniBand/EFA) is slow "
        "for the model's gradient size, or NCCL picked a slow path",
        fix="check NCCL settings: unset NCCL_P2P_DISABLE/NCCL_IB_DISABLE, set "
        "NCCL_SOCKET_IFNAME to the fast NIC (NCCL_DEBUG=INFO shows the transport); "
        "accumulate more micro-batches per sync (no_sync), raise DDP bucket_cap_mb, "
        "compress gradients (TrainConfig(grad_compression='bf16')), or rent NVLink GPUs",
        expected_gain=f"up to {1 / (1 - comm):.2f}x if communication were fully overlapped",
        data={"comm_share": comm},
    )


def _rank_medians(data: RunData) -> dict[int, float]:
    out = {}
    for rank in data.ranks:
        busy = [  # a straggler waits least for the others, so its busy time is longest
            (s.step_s - (comm_s(s) or 0.0) - sync_wait_s(s))
            for s in data.steps
            if s.rank == rank and s.step_s is not None
        ]
        value = median(busy[2:] if len(busy) > 4 else busy)
        if value is not None:
            out[rank] = value
    return out


def stragglers(data: RunData) -> Finding | None:
    per_rank = _rank_medians(data)
    if len(per_rank) >= 2:
        typical = median(per_rank.values()) or 0.0
        slow = {r: t for r, t in per_rank.items() if typical and t >= STRAGGLER_RATIO * typical}
        if slow:
            worst = max(slow, key=slow.get)
            return _straggler(
                data,
                f"rank {worst}",
                slow[worst] / typical,
                f"rank {worst} computes {slow[worst] * 1000:.0f} ms per step vs "
                f"{typical * 1000:.0f} ms median of {len(per_rank)} ranks",
            )
    utils = {i: mean(data.series(f"gpu/{i}/util_pct")) for i in data.gpu_indices()}
    utils = {i: u for i, u in utils.items() if u is not None}
    if len(utils) >= 2 and max(utils.values()) - min(utils.values()) >= GPU_UTIL_SPREAD_PCT:
        hi, lo = max(utils, key=utils.get), min(utils, key=utils.get)
        return _straggler(
            data,
            f"GPU {hi}",
            utils[hi] / max(utils[lo], 1.0),
            f"GPU {hi} {utils[hi]:.0f}% busy vs GPU {lo} {utils[lo]:.0f}% (mean utilization)",
        )
    return None


def _straggler(data: RunData, who: str, ratio: float, evidence: str) -> Finding:
    return _finding(
        data,
        "stragglers",
        "warn",
        symptom=f"{who} is slower than the others, and every synchronous step waits for it",
        evidence=evidence,
        cause="a throttled or faulty GPU, a slow PCIe link, uneven data (longer sequences on "
        "one rank), or a noisy neighbour on that host",
        fix=f"check {who}'s clocks, temperature and PCIe link (cloudtrain doctor); balance the "
        "data (bucket by length); replace the host if it persists",
        expected_gain=f"up to {ratio:.2f}x if every rank ran at the median speed",
        data={"who": who, "ratio": ratio},
    )
