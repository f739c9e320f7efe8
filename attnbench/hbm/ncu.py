"""Nsight Compute (``ncu``): the command lines, and the parser of its raw-page CSV.

Collection (Nsight Compute CLI guide: "Profile from start", "NVTX Filtering")::

    ncu --export R --force-overwrite --log-file L --target-processes application-only
        --profile-from-start off             # only kernels between cudaProfilerStart/Stop ...
        --nvtx --nvtx-include attnbench-hbm/ # ... that also sit inside the push/pop range "attnbench-hbm"
                                             #     (NVTX filter syntax: "A/" a push/pop range anywhere in the stack)
        --clock-control none --cache-control all
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,...   python -m attnbench.hbm.profile ...

The child wraps each timed call in the outer range ``attnbench-hbm`` and an inner
range ``attnbench-hbm:<case_id>:<backend>`` (:func:`range_tag`). The report is then
printed twice with ``--import R --csv --page raw --print-units base``: once as is
(real kernel names) and once with ``--print-nvtx-rename kernel`` (each kernel
renamed after its innermost push/pop range, i.e. the tag). Rows are joined on
ncu's ``ID`` and a metric is summed over every kernel carrying the same tag, so a
backend that launches several kernels per call is counted whole.

Raw-page CSV layout: a header row (``"ID","Process ID",...,"Kernel Name",...,
<metric names>``), a units row (empty identity cells, then ``byte``,
``nsecond``...), then one row per profiled kernel. ncu may print ``==PROF==``
lines around it and thousands separators inside numbers.
"""
from __future__ import annotations

import csv
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

RANGE = "attnbench-hbm"
TAG_RE = re.compile(RANGE + r":([0-9a-f]{12}):([A-Za-z0-9_.+\-]+)")

# unit -> (base unit, factor). Byte prefixes are decimal, as in ncu's auto-scaled output; the
# commands below ask for base units, so the scaling only matters for hand-made or older CSVs.
UNITS = {
    "byte": ("byte", 1.0), "Kbyte": ("byte", 1e3), "Mbyte": ("byte", 1e6), "Gbyte": ("byte", 1e9),
    "Tbyte": ("byte", 1e12),
    "nsecond": ("second", 1e-9), "usecond": ("second", 1e-6), "msecond": ("second", 1e-3), "second": ("second", 1.0),
    "ns": ("second", 1e-9), "us": ("second", 1e-6), "ms": ("second", 1e-3), "s": ("second", 1.0),
}

# ncu's own words for "this host does not let you read the counters"
PERMISSION_MARKERS = ("ERR_NVGPUCTRPERM", "does not have permission to access NVIDIA GPU Performance Counters")


class NcuParseError(ValueError):
    """ncu output that is not a raw-page CSV."""


@dataclass(frozen=True)
class NcuSettings:
    """What to collect and how; built from the ``hbm:`` config section."""

    ncu: str = "ncu"
    read_metric: str = "dram__bytes_read.sum"
    write_metric: str = "dram__bytes_write.sum"
    extra_metrics: tuple[str, ...] = ("gpu__time_duration.sum",)
    clock_control: str = "none"
    cache_control: str = "all"
    nvtx_include: str = RANGE + "/"  # "" leaves selection to cudaProfilerStart/Stop alone

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys([self.read_metric, self.write_metric, *self.extra_metrics]))

    @staticmethod
    def from_config(section: dict) -> "NcuSettings":
        return NcuSettings(ncu=section["ncu"], read_metric=section["read_metric"], write_metric=section["write_metric"],
                           extra_metrics=tuple(section["extra_metrics"]), clock_control=section["clock_control"],
                           cache_control=section["cache_control"], nvtx_include=section["nvtx_include"])


def range_tag(case_id: str, backend: str) -> str:
    """Name of the inner NVTX range around one (case, backend) call."""
    return f"{RANGE}:{case_id}:{backend}"


def find_ncu(ncu: str) -> tuple[str | None, str]:
    """(path, "") when ``ncu`` resolves to an executable, else (None, reason)."""
    path = shutil.which(ncu)
    if path:
        return path, ""
    if "/" in ncu:
        return None, f"ncu path {ncu!r} is not an executable file"
    return None, f"{ncu} not found on PATH (install Nsight Compute or set hbm.ncu)"


def ncu_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"Version\s+(\S+)", out)
    return match.group(1) if match else (out.strip().splitlines() or ["unknown"])[-1]


def profile_command(settings: NcuSettings, ncu_path: str, report: Path, log_file: Path, app: list[str]) -> list[str]:
    """The ncu command that profiles only the timed calls of ``app`` (see the module docstring)."""
    include = ["--nvtx-include", settings.nvtx_include] if settings.nvtx_include else []
    return [ncu_path, "--export", str(report), "--force-overwrite", "--log-file", str(log_file),
            "--target-processes", "application-only", "--profile-from-start", "off", "--nvtx", *include,
            "--clock-control", settings.clock_control, "--cache-control", settings.cache_control,
            "--metrics", ",".join(settings.metrics), *app]


def import_command(ncu_path: str, report: Path, rename: bool) -> list[str]:
    """Print a saved report as raw-page CSV in base units; ``rename`` names kernels after their NVTX range."""
    cmd = [ncu_path, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]
    return cmd + (["--print-nvtx-rename", "kernel"] if rename else [])


def report_file(base: Path) -> Path | None:
    """ncu appends ``.ncu-rep`` to the export name; find what it wrote."""
    for candidate in (base.with_name(base.name + ".ncu-rep"), base):
        if candidate.is_file():
            return candidate
    return None


def permission_problem(text: str) -> str | None:
    """The reason when ncu's log says this host does not let it read the counters, else None."""
    if any(marker in text for marker in PERMISSION_MARKERS):
        return ("ncu may not read GPU performance counters on this host (ERR_NVGPUCTRPERM); "
                "see https://developer.nvidia.com/ERR_NVGPUCTRPERM")
    return None


def error_lines(text: str) -> str:
    """ncu's ``==ERROR==`` lines, joined: the diagnosis attached to calls that got no numbers."""
    return " | ".join(line.strip() for line in text.splitlines() if line.startswith("==ERROR=="))[:500]


def _number(text: str) -> float:
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return float("nan")
    try:
        return float(text)
    except ValueError:
        return float("nan")


@dataclass
class KernelRow:
    """One profiled kernel: ncu's ID, its name, metric values in base units, and those units."""

    id: int
    name: str
    values: dict[str, float] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)


def parse_raw_csv(text: str, metrics: list[str] | None = None) -> list[KernelRow]:
    """Kernel rows of ``ncu --csv --page raw`` output; ``metrics`` (default: all non-identity columns) are kept.

    Raises :class:`NcuParseError` when there is no header, or a wanted metric is missing.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    if start is None:
        first = next((line for line in lines if line.strip()), "")
        raise NcuParseError(f"no raw-page CSV header (\"ID\",...) in ncu output; it begins: {first[:200]!r}")
    rows = [r for r in csv.reader(lines[start:]) if r]
    header, body = rows[0], rows[1:]
    if "Kernel Name" not in header:
        raise NcuParseError("ncu CSV header has no 'Kernel Name' column")
    body = [r for r in body if len(r) == len(header)]  # drops ==PROF== lines and program output
    units = {}
    if body and body[0][0].strip() == "":
        units = dict(zip(header, body.pop(0)))
    identity = set(header[: header.index("Kernel Name") + 1])
    wanted = metrics if metrics is not None else [h for h in header if h not in identity and "__" in h]
    missing = [m for m in wanted if m not in header]
    if missing:
        raise NcuParseError(f"metric {missing[0]!r} is not in the ncu CSV; columns: {', '.join(header)[:300]}")
    out = []
    for r in body:
        cell = dict(zip(header, r))
        row = KernelRow(id=int(_number(cell["ID"])), name=cell["Kernel Name"])
        for metric in wanted:
            unit = units.get(metric, "").strip()
            base, factor = UNITS.get(unit, (unit, 1.0))
            row.values[metric] = _number(cell[metric]) * factor
            row.units[metric] = base
        out.append(row)
    return out


@dataclass
class RangeTotals:
    """Metric sums over the kernels of one NVTX range (one (case, backend) call)."""

    case_id: str
    backend: str
    values: dict[str, float] = field(default_factory=dict)
    kernels: list[str] = field(default_factory=list)  # real names, in launch order, with repeats
    by_order: int = 0  # kernels attributed by launch order, not by their own range name

    @property
    def n_kernels(self) -> int:
        return len(self.kernels)


def attribute(kernels: list[KernelRow], renamed: list[KernelRow]) -> dict[tuple[str, str], RangeTotals]:
    """Sum each metric per (case_id, backend) tag.

    ``renamed`` is the same report printed with ``--print-nvtx-rename kernel``; rows
    pair up by ncu ID. A kernel whose renamed name carries no tag (a library that
    pushes its own NVTX range inside ours) belongs to the tag of the kernel launched
    before it: the profiler range opens only around one tagged call at a time, so
    launch order decides. Such kernels are counted in ``by_order``.
    """
    names = {r.id: r.name for r in renamed}
    totals: dict[tuple[str, str], RangeTotals] = {}
    current = None
    for k in sorted(kernels, key=lambda r: r.id):
        match = TAG_RE.search(names.get(k.id, ""))
        key = (match.group(1), match.group(2)) if match else current
        if key is None:
            raise NcuParseError(f"kernel {k.id} ({k.name[:80]}) is outside every {RANGE}:<case>:<backend> range")
        entry = totals.setdefault(key, RangeTotals(*key))
        for metric, value in k.values.items():  # a kernel without a value makes the sum NaN: unknown, not low
            entry.values[metric] = entry.values.get(metric, 0.0) + value
        entry.kernels.append(k.name)
        entry.by_order += 0 if match else 1
        current = key
    return totals
