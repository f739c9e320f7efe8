"""What the device did while it was timed: clocks, power, temperature, throttling, energy, other users.

CUDA, through NVML (``nvidia-ml-py``, imported as ``pynvml``; without it every column is NaN): a
sampling thread reads, every ``timing.telemetry_ms`` while a round is timed,

* the SM clock (``nvmlDeviceGetClockInfo``, ``NVML_CLOCK_SM``),
* the board power: the instantaneous reading (field ``NVML_FI_DEV_POWER_INSTANT``) where the
  driver has it, since ``nvmlDeviceGetPowerUsage`` returns a one-second average on Ampere and
  later GPUs (NVML reference, ``nvmlDeviceGetPowerUsage``),
* the GPU temperature (``nvmlDeviceGetTemperature``, ``NVML_TEMPERATURE_GPU``),
* the clock-event ("throttle") reasons (``nvmlDeviceGetCurrentClocksEventReasons``, the older
  ``...ThrottleReasons`` on drivers before 535): a reading counts as throttled when the software
  power cap, a hardware slowdown, software or hardware thermal slowdown or the power brake is
  active (:data:`THROTTLE_REASONS`; idle, application clocks, sync boost and display clocks are
  not throttling),
* every few readings, the processes with a context on the device (compute and graphics lists).

Energy per call comes from the board's energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
mJ since the driver loaded, Volta and later) read around a window of back-to-back calls
(:func:`energy_per_call`, ``timing.energy_ms``). The counter is updated every 20-100 ms on recent
GPUs (PETSc's ``PetscLogGpuEnergyMeter`` notes), so a window of some hundreds of ms bounds the
quantisation error to tens of percent at worst and a few percent typically. The window runs
without the L2 flush that the timed rounds have, so for calls whose working set fits in the L2 it
is a lower bound; for calls shorter than their launch (graph-timed decode) it includes the idle
power between launches.

CPU: the mean core frequency where Linux exposes it (``/sys/devices/system/cpu/cpu*/cpufreq/
scaling_cur_freq``, else ``cpu MHz`` of ``/proc/cpuinfo``, which on many VMs is a constant), read
at the start and end of each round (no sampling thread: it would compete for the cores being
timed). Power, temperature and energy are NaN (RAPL's ``energy_uj`` is root-only on most kernels).

Other users of the device, recorded per row (``device_shared``):

* CUDA: another process listed by NVML on the device while a round ran (``other_processes``: the
  listed processes less one, this process, which holds a context while it times; inside a
  container NVML lists it under a host pid it cannot know, so it is not matched by pid). Limits:
  a driver that hides other containers' processes makes this an undercount.
* every device: the CPU time other processes used during the rounds, as a share of the machine
  (``other_cpu_share``: the busy time of ``/proc/stat`` minus this process's own user and system
  time over the same interval, over wall time x CPUs). Limits: it counts kernel threads and
  interrupts as "other"; it resolves a clock tick (10 ms) per CPU, so a round of 0.1 s on two
  CPUs resolves about 5%; in a container it sees the whole host's CPUs. On a CPU a share over
  :data:`SHARED_CPU_SHARE` marks the row shared; on a GPU only another process on the device does.
"""
from __future__ import annotations

import contextlib
import math
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from attnbench.bench.gpu import open_nvml

NAN = math.nan
# Set by `attnbench lease` for the command it runs (attnbench.workflow.lease): "cpu" or "cuda:<id>".
# A row records whether its job held the timing lock of its device (``timing_lock``).
LEASE_ENV = "ATTNBENCH_LEASE"
SHARED_CPU_SHARE = 0.10  # other processes' CPU use over which a CPU row counts as timed on a shared machine
PROCESS_EVERY = 10  # the process list is read every this many samples (and at a window's start and end)

# nvmlClocksEventReason* bits that lower the clock below what the load asks for (pynvml's names and values)
THROTTLE_REASONS = {
    "SwPowerCap": 0x04, "HwSlowdown": 0x08, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
}
THROTTLE_MASK = sum(THROTTLE_REASONS.values())
# Every pynvml name this module uses (a test checks them against the real module when it is installed).
NVML_NAMES = ("nvmlInit", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetClockInfo",
              "NVML_CLOCK_SM", "nvmlDeviceGetFieldValues", "NVML_FI_DEV_POWER_INSTANT", "NVML_SUCCESS",
              "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU",
              "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
              "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
              "nvmlDeviceGetTotalEnergyConsumption", "NVMLError")


@dataclass(frozen=True)
class Reading:
    """One sample; NaN where the source cannot say."""

    clock_mhz: float = NAN
    power_w: float = NAN
    temp_c: float = NAN
    throttled: float = NAN  # 1.0 or 0.0
    others: float = NAN  # other processes with a context on the device


@dataclass
class Window:
    """What one timed round saw."""

    readings: list[Reading] = field(default_factory=list)
    elapsed_s: float = 0.0
    other_cpu_s: float = NAN  # CPU seconds other processes used during the round
    cpus: int = 1

    @property
    def other_cpu_share(self) -> float:
        if not (self.elapsed_s > 0) or math.isnan(self.other_cpu_s):
            return NAN
        return max(0.0, self.other_cpu_s / (self.elapsed_s * self.cpus))


# ------------------------------------------------------------------------------------------- sources

class NullSource:
    """No telemetry (a GPU without NVML): every reading NaN."""

    samples = False

    def read(self, with_processes: bool = False) -> Reading:
        return Reading()

    def energy_mj(self) -> float:
        return NAN


class NvmlSource:
    """One GPU through NVML; ``nvml`` is the ``pynvml`` module (or a stand-in with the same names)."""

    samples = True

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle
        self.broken: set[str] = set()  # queries this device answered with an error: not asked again

    def _ask(self, name: str, fn: Callable[[], float]) -> float:
        if name in self.broken:
            return NAN
        try:
            return float(fn())
        except self.nvml.NVMLError:
            self.broken.add(name)
            return NAN

    def _power_w(self) -> float:
        nvml, handle = self.nvml, self.handle
        if "instant" not in self.broken:
            try:
                value = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_POWER_INSTANT])[0]
                if value.nvmlReturn == nvml.NVML_SUCCESS:
                    return value.value.uiVal / 1e3
            except nvml.NVMLError:
                pass
            self.broken.add("instant")
        return self._ask("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle)) / 1e3

    def _reasons(self) -> int:
        nvml, handle = self.nvml, self.handle
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            if name in self.broken:
                continue
            try:
                return int(getattr(nvml, name)(handle))
            except (nvml.NVMLError, AttributeError):
                self.broken.add(name)
        raise LookupError

    def _throttled(self) -> float:
        try:
            return float(bool(self._reasons() & THROTTLE_MASK))
        except LookupError:
            return NAN

    def other_processes(self) -> float:
        nvml, handle = self.nvml, self.handle
        pids: set[int] = set()
        answered = False
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            if name in self.broken:
                continue
            try:
                pids |= {int(p.pid) for p in getattr(nvml, name)(handle)}
                answered = True
            except nvml.NVMLError:
                self.broken.add(name)
        if not answered:
            return NAN
        return float(count_others(pids))

    def read(self, with_processes: bool = False) -> Reading:
        nvml, handle = self.nvml, self.handle
        return Reading(clock_mhz=self._ask("clock", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                       power_w=self._power_w(),
                       temp_c=self._ask("temp", lambda: nvml.nvmlDeviceGetTemperature(handle,
                                                                                      nvml.NVML_TEMPERATURE_GPU)),
                       throttled=self._throttled(),
                       others=self.other_processes() if with_processes else NAN)

    def energy_mj(self) -> float:
        return self._ask("energy", lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))


def count_others(pids: set[int]) -> int:
    """Processes on the device other than this one. This process holds a context while it times, so
    one listed process is this one, under its own pid or, inside a container, under a host pid it
    cannot know."""
    return max(0, len(pids) - 1)


class CpuSource:
    """The host's cores: their mean frequency where Linux exposes it."""

    samples = False

    def __init__(self, sys_root: str | Path = "/sys/devices/system/cpu", cpuinfo: str | Path = "/proc/cpuinfo"):
        self.freq_files = sorted(Path(sys_root).glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))
        self.cpuinfo = Path(cpuinfo)

    def clock_mhz(self) -> float:
        values = []
        for path in self.freq_files:  # kHz
            try:
                values.append(int(path.read_text()) / 1e3)
            except (OSError, ValueError):
                pass
        if not values:
            try:
                values = [float(line.split(":", 1)[1]) for line in self.cpuinfo.read_text().splitlines()
                          if line.lower().startswith("cpu mhz")]
            except (OSError, ValueError, IndexError):
                values = []
        return sum(values) / len(values) if values else NAN

    def read(self, with_processes: bool = False) -> Reading:
        return Reading(clock_mhz=self.clock_mhz())

    def energy_mj(self) -> float:
        return NAN


def host_cpu_seconds(stat: str | Path = "/proc/stat") -> tuple[float, int]:
    """(busy CPU seconds of the whole machine since boot, number of CPUs) from ``/proc/stat``.

    Busy = user + nice + system + irq + softirq + steal (guest time is inside user already).
    """
    try:
        lines = Path(stat).read_text().splitlines()
    except OSError:
        return NAN, 1
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    fields = [int(x) for x in lines[0].split()[1:]]
    busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return busy / ticks, max(1, cpus)


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------------------------------- telemetry

class Telemetry:
    """Readings of one device around timed rounds (:meth:`window`) and its energy counter."""

    def __init__(self, source, interval_ms: float, stat: str | Path = "/proc/stat"):
        self.source, self.interval_s, self.stat = source, interval_ms / 1e3, stat

    @classmethod
    def open(cls, device: str, interval_ms: float) -> "Telemetry":
        if device == "cuda":
            opened = open_nvml()
            return cls(NvmlSource(*opened) if opened else NullSource(), interval_ms)
        return cls(CpuSource(), interval_ms)

    @contextlib.contextmanager
    def window(self) -> Iterator[Window]:
        """Read at the start, every ``interval`` in a thread (NVML only) and at the end of the block."""
        w = Window()
        busy0, w.cpus = host_cpu_seconds(self.stat)
        own0, start = own_cpu_seconds(), time.perf_counter()
        w.readings.append(self.source.read(with_processes=True))
        stop = threading.Event()
        thread = None
        if self.source.samples and self.interval_s > 0:
            def sample():
                n = 0
                while not stop.wait(self.interval_s):
                    n += 1
                    w.readings.append(self.source.read(with_processes=n % PROCESS_EVERY == 0))

            thread = threading.Thread(target=sample, name="attnbench-telemetry", daemon=True)
            thread.start()
        try:
            yield w
        finally:
            stop.set()
            if thread is not None:
                thread.join()
            w.readings.append(self.source.read(with_processes=True))
            w.elapsed_s = time.perf_counter() - start
            busy1, _ = host_cpu_seconds(self.stat)
            w.other_cpu_s = (busy1 - busy0) - (own_cpu_seconds() - own0)

    def energy_mj(self) -> float:
        return self.source.energy_mj()


def energy_per_call(fn: Callable, telemetry: Telemetry, seconds: float, estimate_s: float,
                    sync: Callable[[], None]) -> float:
    """Joules per call from the energy counter around ``ceil(seconds / estimate_s)`` back-to-back calls."""
    if not (seconds > 0 and estimate_s > 0) or math.isnan(telemetry.energy_mj()):
        return NAN
    calls = max(1, math.ceil(seconds / estimate_s))
    sync()
    before = telemetry.energy_mj()
    for _ in range(calls):
        fn()
    sync()
    after = telemetry.energy_mj()
    return (after - before) / 1e3 / calls if after >= before else NAN


def summarize(windows: list[Window], device: str) -> dict:
    """A row's telemetry columns from the windows of its kept rounds."""
    readings = [r for w in windows for r in w.readings]

    def mean(values):
        values = [v for v in values if not math.isnan(v)]
        return sum(values) / len(values) if values else NAN

    def largest(values):
        values = [v for v in values if not math.isnan(v)]
        return max(values) if values else NAN

    elapsed = sum(w.elapsed_s for w in windows)
    shares = [(w.other_cpu_share, w.elapsed_s) for w in windows if not math.isnan(w.other_cpu_share)]
    other_cpu = sum(s * t for s, t in shares) / sum(t for _, t in shares) if shares and elapsed > 0 else NAN
    others = largest(r.others for r in readings)
    clock = mean(r.clock_mhz for r in readings)
    if device == "cuda":
        shared = bool(others > 0) if not math.isnan(others) else None
    else:
        shared = bool(other_cpu > SHARED_CPU_SHARE) if not math.isnan(other_cpu) else None
    return {"sm_clock_mhz": clock if device == "cuda" else NAN, "cpu_clock_mhz": clock if device != "cuda" else NAN,
            "power_w": mean(r.power_w for r in readings), "temp_c": largest(r.temp_c for r in readings),
            "throttle_share": mean(r.throttled for r in readings), "other_processes": others,
            "other_cpu_share": other_cpu, "device_shared": shared}


def throttled(window: Window) -> bool:
    """Whether any reading of the round saw a throttle reason."""
    return any(r.throttled == 1.0 for r in window.readings)
