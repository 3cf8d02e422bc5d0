"""The monitor: NVML chokepoint, recorded readings, snapshots, energy, host and sampler."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from cloudtrain.monitor import (
    CounterMeter,
    CpuEnergyMeter,
    GPUReader,
    HostReader,
    Nvml,
    RecordedSource,
    Sampler,
    SamplerConfig,
    snapshot_metrics,
)
from cloudtrain.monitor import snapshots as snap
from cloudtrain.monitor.energy import RaplMeter, estimate_cpu_power_w, rapl_domains
from cloudtrain.monitor.keys import gpu_indices
from cloudtrain.store import RunStore

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


def recorded(name: str) -> tuple[Nvml, RecordedSource]:
    source = RecordedSource.load(FIXTURES / f"{name}.json")
    return Nvml(source), source


def frame_clock(source: RecordedSource, start: float = 1_700_000_000.0):
    return lambda: start + (source.frame_time_s or 0.0)


# -- the chokepoint ----------------------------------------------------------------------


def test_real_nvml_without_driver_is_unavailable_and_every_query_is_none():
    nvml = Nvml()  # the real library; this machine may or may not have a GPU
    if nvml.available:
        pytest.skip("NVML works here; covered by the recorded and GPU tests")
    assert "NVML" in (nvml.unavailable_reason or "") or "driver" in nvml.unavailable_reason
    assert nvml.device_count() == 0
    assert nvml.query(0, "nvmlDeviceGetPowerUsage") is None
    assert nvml.query(None, "nvmlSystemGetDriverVersion") is None


def test_recorded_init_error_reads_like_a_machine_without_driver():
    nvml, _ = recorded("no_driver")
    assert not nvml.available
    assert nvml.unavailable_reason == "NVML library not found (no NVIDIA driver installed)"
    assert GPUReader(nvml).read(0.0) == ()


def test_not_supported_becomes_none_and_is_not_asked_again():
    calls: list[str] = []

    class Counting(RecordedSource):
        def device_call(self, index, name, *args):
            calls.append(name)
            return super().device_call(index, name, *args)

    source = Counting(RecordedSource.load(FIXTURES / "t4_idle.json").recording)
    nvml = Nvml(source)
    assert nvml.query(0, "nvmlDeviceGetTotalEnergyConsumption") is None
    assert nvml.query(0, "nvmlDeviceGetTotalEnergyConsumption") is None
    assert calls.count("nvmlDeviceGetTotalEnergyConsumption") == 1
    assert nvml.query(0, "nvmlDeviceGetName") == "Tesla T4"


def test_other_nvml_errors_become_none_but_are_retried():
    class Flaky(RecordedSource):
        fail = True

        def device_call(self, index, name, *args):
            if self.fail:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return super().device_call(index, name, *args)

    source = Flaky(RecordedSource.load(FIXTURES / "h100_load.json").recording)
    nvml = Nvml(source)
    assert nvml.query(0, "nvmlDeviceGetPowerUsage") is None
    source.fail = False
    assert nvml.query(0, "nvmlDeviceGetPowerUsage") == 652100


def test_throttle_bits_match_nvml():
    assert pynvml.nvmlClocksEventReasonSwPowerCap == snap.THROTTLE_SW_POWER_CAP
    assert pynvml.nvmlClocksEventReasonHwThermalSlowdown == snap.THROTTLE_HW_THERMAL
    assert pynvml.nvmlClocksEventReasonSwThermalSlowdown == snap.THROTTLE_SW_THERMAL
    assert pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown == snap.THROTTLE_HW_POWER_BRAKE
    assert pynvml.nvmlClocksEventReasonGpuIdle == snap.THROTTLE_GPU_IDLE
    assert snap.throttle_names(0x4 | 0x20 | 0x1) == ["power cap", "software thermal"]
    assert snap.throttle_names(None) == []


def test_bad_recording_names_the_file(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(Exception, match=r"bad\.json"):
        RecordedSource.load(bad)


# -- GPU snapshots from recordings -------------------------------------------------------


def test_h100_under_load_snapshot_units():
    nvml, _source = recorded("h100_load")
    reader = GPUReader(nvml)
    gpus = reader.read(0.0)
    assert len(gpus) == 2
    g = gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert g.util_pct == 99.0
    assert g.memory_total_gib == pytest.approx(79.65, abs=0.01)
    assert g.memory_used_gib == pytest.approx(70.2, abs=0.01)
    assert g.power_w == pytest.approx(652.1)
    assert g.power_limit_w == 700.0
    assert g.temperature_c == 64.0
    assert g.sm_clock_mhz == g.sm_clock_max_mhz == 1980.0
    assert g.throttling == []
    assert g.pcie_rx_mib_per_s == pytest.approx(182000 / 1024)
    assert g.sm_active_pct == 93.5 and g.tensor_active_pct == pytest.approx(61.2)
    assert g.ecc_uncorrected_volatile == 0
    assert g.process_count == 1
    assert g.energy_j == 0.0 and g.energy_from_counter


def test_energy_from_counter_differences():
    nvml, source = recorded("h100_load")
    reader = GPUReader(nvml)
    reader.read(0.0)
    for t in range(1, 6):
        source.refresh()
        gpus = reader.read(float(t))
    # counter advanced by the recorded power (mW x 1 s = mJ) of frames 0..4
    expected_j = (652100 + 661400 + 643800 + 655000 + 649900) / 1000
    assert gpus[0].energy_j == pytest.approx(expected_j)
    assert gpus[0].energy_from_counter


def test_energy_integrates_power_without_counter():
    nvml, source = recorded("t4_idle")
    reader = GPUReader(nvml)
    energies = []
    for _ in range(3):
        energies.append(reader.read(source.frame_time_s or 0.0)[0].energy_j)
        source.refresh()
    assert energies[0] == 0.0
    # trapezoid over 60 s between 27.0 W and 27.5 W
    assert energies[1] == pytest.approx(60 * (27.0 + 27.5) / 2)
    g = reader.read(source.frame_time_s or 0.0)[0]
    assert not g.energy_from_counter
    assert g.throttle_reasons == snap.THROTTLE_GPU_IDLE  # from the older throttle API
    assert g.sm_active_pct is None  # no GPM on a T4


def test_throttled_gpu_snapshot():
    nvml, _ = recorded("a100_throttled")
    g = GPUReader(nvml).read(0.0)[0]
    assert g.throttling == ["power cap", "software thermal"]
    assert g.sm_clock_mhz == 1110.0 and g.sm_clock_max_mhz == 1410.0
    assert g.temperature_c == 88.0


def test_counter_meter_survives_counter_reset():
    meter = CounterMeter()
    meter.update(0.0, counter_j=1000.0, power_w=None)
    meter.update(1.0, counter_j=1100.0, power_w=None)
    meter.update(2.0, counter_j=5.0, power_w=None)  # driver reloaded
    meter.update(3.0, counter_j=55.0, power_w=None)
    assert meter.energy_j == pytest.approx(150.0)


# -- CPU energy --------------------------------------------------------------------------


def _fake_rapl(root: Path, energy_uj: int, max_uj: int = 1_000_000) -> Path:
    domain = root / "intel-rapl:0"
    domain.mkdir(parents=True, exist_ok=True)
    (domain / "energy_uj").write_text(str(energy_uj))
    (domain / "max_energy_range_uj").write_text(str(max_uj))
    (root / "intel-rapl:0:0").mkdir(exist_ok=True)  # a sub-domain: not counted
    return domain


def test_rapl_counter_with_wraparound(tmp_path: Path):
    domain = _fake_rapl(tmp_path, 900_000)
    domains = rapl_domains(tmp_path)
    assert [d.name for d in domains] == ["intel-rapl:0"]
    meter = RaplMeter(domains)
    assert meter.read() == 0.0
    (domain / "energy_uj").write_text("100000")  # wrapped at 1_000_000
    assert meter.read() == pytest.approx(0.2)


def test_cpu_meter_uses_rapl_when_readable_else_estimate(tmp_path: Path):
    domain = _fake_rapl(tmp_path / "rapl", 0, 10**12)
    meter = CpuEnergyMeter(rapl_root=tmp_path / "rapl")
    assert not meter.estimated
    meter.update(0.0, 50.0)
    (domain / "energy_uj").write_text(str(30_000_000))  # 30 J
    power, energy = meter.update(2.0, 50.0)
    assert energy == pytest.approx(30.0) and power == pytest.approx(15.0)

    estimate = CpuEnergyMeter(rapl_root=tmp_path / "none", tdp_w=100.0)
    assert estimate.estimated
    estimate.update(0.0, 50.0)
    power, energy = estimate.update(10.0, 50.0)
    assert power == estimate_cpu_power_w(50.0, 100.0) == 50.0
    assert energy == pytest.approx(500.0)


# -- host --------------------------------------------------------------------------------


def test_host_reader_rates_and_process_tree():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys,time; "
            "p=subprocess.Popen([sys.executable,'-c','import time; time.sleep(30)']); "
            "time.sleep(30)",
        ]
    )
    try:
        time.sleep(0.5)
        reader = HostReader(pid=child.pid)
        first = reader.read(time.time())
        assert first.cpu_pct is None and first.cpu_per_core_pct == ()
        time.sleep(0.2)
        second = reader.read(time.time())
        assert second.cpu_pct is not None and 0.0 <= second.cpu_pct <= 100.0
        assert len(second.cpu_per_core_pct) == second.cpu_count
        assert second.ram_total_gib > second.ram_used_gib > 0
        assert second.cpu_power_w is not None and second.cpu_energy_j is not None
        proc = second.process
        assert proc is not None and proc.running and proc.num_procs == 2
        assert proc.rss_gib > 0 and proc.cpu_pct is not None
    finally:
        child.kill()
        child.wait()
    gone = reader.read(time.time()).process
    assert gone is not None and not gone.running


# -- sampler -----------------------------------------------------------------------------


def test_sampler_metrics_keys_from_recording():
    nvml, source = recorded("h100_load")
    sampler = Sampler(nvml=nvml, clock=frame_clock(source))
    sampler.read()
    metrics = snapshot_metrics(sampler.read())
    assert gpu_indices(metrics) == [0, 1]
    assert metrics["gpu/1/power_w"] == pytest.approx(655.2)  # frame 1 of the recording
    assert metrics["gpu/0/energy_j"] > 0
    assert metrics["gpu/count"] == 2.0
    assert metrics["host/cpu_pct"] is not None
    assert metrics["host/cpu_power_estimated"] in (0.0, 1.0)


def test_sampler_without_gpu_still_samples_host(tmp_path: Path):
    nvml, _ = recorded("no_driver")
    snapshot = Sampler(nvml=nvml).read()
    assert snapshot.gpus == () and not snapshot.nvml_available
    assert snapshot.nvml_unavailable_reason
    assert snapshot.host.ram_total_gib > 0


def test_sampler_thread_writes_batches_to_the_store(tmp_path: Path):
    nvml, _source = recorded("h100_load")
    store = RunStore.open(tmp_path / "store.db")
    run_id = store.create_run("sampled", kind="watch")
    seen = []
    config = SamplerConfig(interval_s=0.05, flush_interval_s=0.1)
    with Sampler(config=config, nvml=nvml, store=store, run_id=run_id) as sampler:
        sampler.add_listener(seen.append)
        sampler.add_listener(lambda s: 1 / 0)  # a broken listener does not stop sampling
        deadline = time.monotonic() + 10
        while len(seen) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    samples = store.samples(run_id)
    assert len(samples) >= 4
    assert samples[-1].metrics["gpu/0/util_pct"] in (98.0, 99.0)
    assert samples[0].run_id == run_id and samples[0].host
    assert [s.time_unix_s for s in samples] == sorted(s.time_unix_s for s in samples)
    store.close()


def test_sampler_config_validates():
    with pytest.raises(ValueError, match="interval_s"):
        SamplerConfig(interval_s=0)


@pytest.mark.gpu
def test_real_nvml_on_a_gpu():
    nvml = Nvml()
    if not nvml.available:
        pytest.skip(f"no NVML here: {nvml.unavailable_reason}")
    reader = GPUReader(nvml)
    first = reader.read(time.time())
    time.sleep(1.0)
    second = reader.read(time.time())
    assert len(second) == nvml.device_count() > 0
    g = second[0]
    assert g.memory_total_gib and g.memory_total_gib > 1
    assert g.power_w is None or 5 < g.power_w < 2000
    assert g.energy_j is None or g.energy_j >= 0
    assert first[0].name == g.name


# -- dashboard and run progress ----------------------------------------------------------


def test_run_progress_and_dashboard(tmp_path: Path):
    from rich.console import Console

    from cloudtrain.monitor.dashboard import render
    from cloudtrain.monitor.session import active_run, run_progress
    from cloudtrain.store import StepRecord

    nvml, source = recorded("a100_throttled")
    sampler = Sampler(nvml=nvml, clock=frame_clock(source))
    sampler.read()
    snapshot = sampler.read()
    with RunStore.open(tmp_path / "s.db") as store:
        run_id = store.create_run(
            "progress",
            config={"max_steps": 100},
            price_usd_per_hour=2.0,
            provider="aws",
            region="us-east-1",
        )
        store.add_steps(
            [
                StepRecord(
                    run_id,
                    step,
                    1000.0 + step * 0.5,
                    mfu=0.41,
                    loss=2.5,
                    metrics={"throughput/samples_per_sec": 64.0},
                )
                for step in range(1, 21)
            ]
        )
        run = active_run(store)
        assert run is not None and run.id == run_id
        progress = run_progress(store, run, snapshot, now=run.started_at + 360)
    assert progress.step == 20 and progress.steps_per_s == pytest.approx(2.0)
    assert progress.eta_s == pytest.approx(40.0) and progress.samples_per_s == 64.0
    assert progress.cost_usd == pytest.approx(0.2)
    assert progress.gpu_energy_kwh is not None and progress.kg_co2e is not None
    console = Console(record=True, width=140)
    console.print(render(snapshot, progress))
    text = console.export_text()
    assert "NVIDIA A100-PCIE-40GB" in text and "pwr cap,sw therm" in text
    assert "step 20/100" in text and "MFU 41.0%" in text and "ETA 0m40s" in text
    assert "0.20 USD" in text
