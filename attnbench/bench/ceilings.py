"""Roofline ceilings measured on the host at the start of a run, not taken from a datasheet.

* Bandwidth: a device-to-device copy of a large buffer, counting bytes read plus
  bytes written (the convention of STREAM's copy and of NVIDIA's bandwidthTest).
* Compute: a dense square matmul per dtype (``torch.matmul``; fp8 e4m3 through
  ``torch._scaled_mm`` where the GPU has it), 2·n^3 FLOPs per product, on random
  data (zeros run faster on some GPUs and would flatter the ceiling).

Sizes are large enough to leave caches and launch overhead behind on a GPU
(1 GiB copy, 8192^3 matmul) and small enough to finish in seconds on two CPU cores.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from attnbench.bench.provenance import environment, timestamp
from attnbench.bench.timing import time_callable

SIZES = {"cuda": {"copy_bytes": 1 << 30, "matmul_n": 8192}, "cpu": {"copy_bytes": 1 << 27, "matmul_n": 1024}}


@dataclass
class Ceilings:
    device: str
    device_name: str
    copy_bytes_per_s: float
    matmul_flops_per_s: dict[str, float] = field(default_factory=dict)
    measured_at: str = ""

    def peak_flops(self, dtype: str) -> float:
        """The fastest measured matmul that can take ``dtype`` inputs: its own rate, or fp32's if faster.

        On CPUs without native half-precision matmul units, fp16/bf16 work is
        upcast to fp32 and runs faster than the native low-precision matmul;
        the ceiling must cover that path too. On GPUs the dtype's own rate wins.
        """
        rates = [self.matmul_flops_per_s.get(dtype, float("nan"))]
        if dtype in ("fp16", "bf16"):
            rates.append(self.matmul_flops_per_s.get("fp32", float("nan")))
        rates = [r for r in rates if r == r]
        return max(rates) if rates else float("nan")

    def ridge(self, dtype: str) -> float:
        return self.peak_flops(dtype) / self.copy_bytes_per_s

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @staticmethod
    def load(path: str | Path) -> "Ceilings":
        """A file :meth:`save` wrote; one line naming the file for anything else (missing, empty, corrupt, foreign)."""
        from attnbench.files import InputError, read_json

        data = read_json(path, "ceilings file (attnbench ceilings)")
        names = {f.name for f in fields(Ceilings)}
        if not isinstance(data, dict) or not {"device", "device_name", "copy_bytes_per_s"} <= set(data) \
                or set(data) - names:
            found = ", ".join(sorted(map(str, data))) if isinstance(data, dict) else type(data).__name__
            raise InputError(f"{path}: not a ceilings file (found {found[:120]}); allowed: the JSON `attnbench "
                             f"ceilings` writes, with keys {', '.join(sorted(names))}")
        matmul = data.get("matmul_flops_per_s", {})
        if not isinstance(matmul, dict):
            raise InputError(f"{path}: matmul_flops_per_s={matmul!r} is not allowed; allowed: dtype -> FLOP/s")
        rates = {"copy_bytes_per_s": data["copy_bytes_per_s"],
                 **{f"matmul_flops_per_s.{dtype}": rate for dtype, rate in matmul.items()}}
        for key, value in rates.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise InputError(f"{path}: {key}={value!r} is not allowed; allowed: a positive finite rate")
        return Ceilings(**data)


def measure_copy(device: str) -> float:
    n = SIZES[device]["copy_bytes"]
    src = torch.randint(0, 127, (n,), dtype=torch.int8, device=device)
    dst = torch.empty_like(src)
    t = time_callable(lambda: dst.copy_(src), device, rep_ms=200)
    return 2 * n / t.median


def measure_matmul(device: str, dtype: str) -> float:
    n = SIZES[device]["matmul_n"]
    if dtype == "fp8":
        if device != "cuda" or torch.cuda.get_device_capability() < (8, 9):
            return float("nan")
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        a = torch.randn(n, n, device=device, dtype=torch_dtype)
        b = torch.randn(n, n, device=device, dtype=torch_dtype)
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    t = time_callable(fn, device, rep_ms=300)
    return 2 * n**3 / t.median


def measure_ceilings(device: str, dtypes=("fp32", "fp16", "bf16", "fp8")) -> Ceilings:
    flops = {}
    for d in dtypes:
        try:
            rate = measure_matmul(device, d)
        except (RuntimeError, TypeError):  # a dtype this device's matmul does not take
            rate = float("nan")
        if rate == rate:
            flops[d] = rate
    return Ceilings(device=device, device_name=environment(device)["device_name"],
                    copy_bytes_per_s=measure_copy(device), matmul_flops_per_s=flops, measured_at=timestamp())
