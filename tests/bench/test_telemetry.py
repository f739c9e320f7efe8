"""Telemetry logic against a stand-in NVML module (the names and behaviour of nvidia-ml-py's pynvml)."""
import math
import os
import time
from types import SimpleNamespace

import pytest

from attnbench.bench import telemetry


class FakeNvml:
    """Just the pynvml functions and constants attnbench.bench.telemetry uses, driven by the test."""

    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_POWER_INSTANT = 186

    class NVMLError(Exception):
        pass

    def __init__(self, *, reasons=0x1, instant=True, event_reasons=True, pids=(), clock=1980, power_mw=650_000,
                 temp=60):
        self.reasons, self.instant, self.event_reasons = reasons, instant, event_reasons
        self.pids, self.clock, self.power_mw, self.temp = list(pids), clock, power_mw, temp
        self.energy = 1_000_000  # mJ since the driver loaded
        self.calls: list[str] = []

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return self.clock

    def nvmlDeviceGetFieldValues(self, handle, ids):
        assert ids == [self.NVML_FI_DEV_POWER_INSTANT]
        value = SimpleNamespace(uiVal=self.power_mw + 5_000)  # the instantaneous reading, a little above the mean
        return [SimpleNamespace(nvmlReturn=self.NVML_SUCCESS if self.instant else self.NVML_ERROR_NOT_SUPPORTED,
                                value=value)]

    def nvmlDeviceGetPowerUsage(self, handle):
        self.calls.append("power_usage")
        return self.power_mw

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        if not self.event_reasons:  # drivers before 535
            raise self.NVMLError("Function Not Found")
        return self.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        self.calls.append("throttle_reasons")
        return self.reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=p) for p in self.pids]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.energy


def source(**kw):
    nvml = FakeNvml(**kw)
    return nvml, telemetry.NvmlSource(nvml, handle="gpu0")


@pytest.mark.parametrize("reasons, throttled", [
    (0x1, 0.0),  # GPU idle: not throttling
    (0x2 | 0x10, 0.0),  # application clocks, sync boost
    (0x4, 1.0),  # software power cap
    (0x20, 1.0),  # software thermal slowdown
    (0x80 | 0x1, 1.0),  # power brake
])
def test_throttle_reasons_that_lower_the_clock(reasons, throttled):
    _, s = source(reasons=reasons)
    assert s.read().throttled == throttled


def test_a_reading_takes_the_instantaneous_power_where_the_driver_has_it():
    nvml, s = source()
    r = s.read()
    assert (r.clock_mhz, r.power_w, r.temp_c) == (1980, 655.0, 60) and "power_usage" not in nvml.calls
    nvml, s = source(instant=False)  # the one-second average instead
    assert s.read().power_w == 650.0 and s.read().power_w == 650.0 and nvml.calls.count("power_usage") == 2


def test_older_drivers_fall_back_to_the_throttle_reasons_call():
    nvml, s = source(reasons=0x4, event_reasons=False)
    assert s.read().throttled == 1.0 and s.read().throttled == 1.0
    assert nvml.calls.count("throttle_reasons") == 2  # the missing call is not tried again


def test_other_processes_leave_this_one_out_whatever_its_pid():
    mine = os.getpid()
    for pids, others in (([mine], 0), ([mine, 4242], 1), ([90001], 0), ([90001, 90002], 1), ([], 0)):
        _, s = source(pids=pids)
        assert s.read(with_processes=True).others == others
    _, s = source(pids=[mine, 4242])
    assert math.isnan(s.read().others)  # only read when asked (every few samples)


def test_a_window_samples_in_a_thread_and_summarizes_into_row_columns():
    nvml, s = source(reasons=0x4, pids=[os.getpid(), 777])
    t = telemetry.Telemetry(s, interval_ms=2)
    with t.window() as w:
        time.sleep(0.05)
    assert len(w.readings) >= 5 and w.elapsed_s >= 0.05
    nvml.reasons, nvml.temp = 0x1, 75
    with t.window() as w2:
        pass
    row = telemetry.summarize([w, w2], "cuda")
    share = (len(w.readings)) / (len(w.readings) + len(w2.readings))
    assert row["throttle_share"] == pytest.approx(share) and row["temp_c"] == 75 and row["sm_clock_mhz"] == 1980
    assert row["other_processes"] == 1 and row["device_shared"] is True and math.isnan(row["cpu_clock_mhz"])


def test_energy_per_call_from_the_counter():
    nvml, s = source()
    t = telemetry.Telemetry(s, interval_ms=0)

    def call():
        nvml.energy += 250  # 0.25 J a call

    assert telemetry.energy_per_call(call, t, seconds=0.01, estimate_s=0.001, sync=lambda: None) == 0.25
    assert math.isnan(telemetry.energy_per_call(call, telemetry.Telemetry(telemetry.NullSource(), 0), 0.01, 0.001,
                                                lambda: None))


def test_a_cpu_reads_its_frequency_from_sysfs_or_cpuinfo(tmp_path):
    for i, khz in enumerate((2_000_000, 3_000_000)):
        (tmp_path / "sys" / f"cpu{i}" / "cpufreq").mkdir(parents=True)
        (tmp_path / "sys" / f"cpu{i}" / "cpufreq" / "scaling_cur_freq").write_text(f"{khz}\n")
    (tmp_path / "cpuinfo").write_text("processor: 0\ncpu MHz\t\t: 1200.5\nprocessor: 1\ncpu MHz\t\t: 1300.5\n")
    assert telemetry.CpuSource(tmp_path / "sys", tmp_path / "cpuinfo").clock_mhz() == 2500.0
    assert telemetry.CpuSource(tmp_path / "none", tmp_path / "cpuinfo").clock_mhz() == 1250.5
    assert math.isnan(telemetry.CpuSource(tmp_path / "none", tmp_path / "missing").clock_mhz())


def test_other_processes_cpu_time_over_a_window(tmp_path):
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")

    def write(busy_ticks):  # user nice system idle iowait irq softirq steal, then two CPUs
        stat.write_text(f"cpu  {busy_ticks} 0 0 1000 0 0 0 0 0 0\ncpu0 1 0 0 0\ncpu1 1 0 0 0\n")

    write(0)
    t = telemetry.Telemetry(telemetry.CpuSource(tmp_path, tmp_path / "none"), interval_ms=20, stat=stat)
    with t.window() as w:
        write(2 * ticks)  # the machine was busy for 2 CPU seconds, almost none of them this process's
    assert w.cpus == 2 and w.other_cpu_s == pytest.approx(2.0, abs=0.05)
    idle = telemetry.Window(elapsed_s=1.0, other_cpu_s=0.1, cpus=2)
    busy = telemetry.Window(elapsed_s=1.0, other_cpu_s=1.0, cpus=2)
    assert telemetry.summarize([idle], "cpu")["device_shared"] is False  # 5% of the machine
    assert telemetry.summarize([idle, busy], "cpu")["other_cpu_share"] == pytest.approx(0.275)
    assert telemetry.summarize([busy], "cpu")["device_shared"] is True


def test_every_nvml_name_used_exists_in_nvidia_ml_py():
    pynvml = pytest.importorskip("pynvml")
    assert [n for n in telemetry.NVML_NAMES if not hasattr(pynvml, n)] == []
    bits = telemetry.THROTTLE_REASONS.items()
    assert all(getattr(pynvml, f"nvmlClocksEventReason{name}") == bit for name, bit in bits)
    fake = FakeNvml()
    assert [n for n in telemetry.NVML_NAMES if n not in ("nvmlInit", "nvmlDeviceGetHandleByUUID",
                                                         "nvmlDeviceGetHandleByIndex") and not hasattr(fake, n)] == []


@pytest.mark.gpu
def test_real_nvml_reads_the_gpu_torch_uses():
    pytest.importorskip("pynvml")
    import torch

    torch.zeros(1, device="cuda")
    t = telemetry.Telemetry.open("cuda", interval_ms=5)
    assert isinstance(t.source, telemetry.NvmlSource)
    a = torch.randn(4096, 4096, device="cuda")
    with t.window() as w:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
    row = telemetry.summarize([w], "cuda")
    assert row["sm_clock_mhz"] > 100 and row["power_w"] > 10 and row["temp_c"] > 0
    assert row["other_processes"] >= 0 and 0 <= row["throttle_share"] <= 1
    energy = telemetry.energy_per_call(lambda: a @ a, t, 0.5, 1e-3, torch.cuda.synchronize)
    assert 0 < energy < 10  # joules for one 137 GFLOP matmul: well under a joule on any recent GPU
