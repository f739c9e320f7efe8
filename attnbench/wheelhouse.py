"""Wheels of the optional GPU backends for a host without network.

On a machine with network (any OS): resolve the backend's dependency closure for the *target*
interpreter and platform with pip's resolver (``pip install --dry-run --report``, which reads
package metadata without installing), drop what the GPU host already has (its PyTorch, Triton,
the CUDA runtime wheels PyTorch brings, and any names listed with ``--have``), download the rest
as wheels with ``pip download --no-deps``, and write a pinned ``requirements.txt``. On the GPU
host::

    pip install --no-index --find-links DIR --no-deps -r DIR/requirements.txt

``--no-deps`` is deliberate: resolving again on the host could replace its CUDA build of
PyTorch with a different one from the wheelhouse.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

# Top-level requirements of each set; ``{cuda_extra}`` becomes the extra that pulls CUDA-major-specific
# wheels (flash-attn-4 declares ``cu13`` -> ``nvidia-cutlass-dsl[cu13]``). Add pins with --require.
SETS: dict[str, tuple[str, ...]] = {
    # a pre-release specifier: PyPI's only final flash-attn-4 release is a 0.0.1 placeholder without wheels
    "fa4": ("flash-attn-4{cuda_extra}>=4.0.0b36",),
    "flashinfer": ("flashinfer-python",),  # JIT-compiles kernels with the host's nvcc at first use
}
CUDA_EXTRAS = {13: "[cu13]"}
# Always on the GPU host with its PyTorch: never download them (a second torch would replace the host's build).
HOST_PROVIDED = re.compile(
    r"^(torch|triton|nvidia-(cublas|cuda-cupti|cuda-nvrtc|cuda-runtime|cudnn|cufft|cufile|curand|cusolver|"
    r"cusparse|cusparselt|nccl|nvjitlink|nvshmem|nvtx)(-cu\d+)?)$")
CUDA_FLAVOUR = re.compile(r"-cu(\d+)$")


class WheelhouseError(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    """The interpreter and platform of the GPU host."""

    python: str = "3.12"
    glibc: str = "2.28"
    machine: str = "x86_64"
    cuda: int = 13

    def platforms(self) -> list[str]:
        """Every manylinux tag a host with this glibc accepts, newest first (PEP 600), plus the legacy alias."""
        major, minor = (int(x) for x in self.glibc.split("."))
        if major != 2 or minor < 17:
            raise WheelhouseError(f"glibc={self.glibc!r} is not allowed; allowed: 2.17 or newer, as MAJOR.MINOR")
        tags = [f"manylinux_2_{m}_{self.machine}" for m in range(minor, 16, -1)]
        return tags + [f"manylinux2014_{self.machine}", f"linux_{self.machine}"]

    def pip_target_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python]
        for tag in self.platforms():
            args += ["--platform", tag]
        return args


def normalize(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(sets: Iterable[str], extra: Iterable[str] = (), cuda: int = 13) -> list[str]:
    out = []
    for s in sets:
        if s not in SETS:
            raise WheelhouseError(f"set={s!r} is not known; allowed: {', '.join(SETS)}")
        out += [r.format(cuda_extra=CUDA_EXTRAS.get(cuda, "")) for r in SETS[s]]
    out += list(extra)
    if not out:
        raise WheelhouseError(f"nothing to download; give --sets ({', '.join(SETS)}) or --require NAME==VERSION")
    return out


def resolve_command(reqs: list[str], target: Target, report: str, scratch: str) -> list[str]:
    """pip's resolver for the target platform; ``--target`` is required by pip for platform options."""
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--report", report, "--target", scratch, *target.pip_target_args(), *reqs]


def download_command(pins: list[str], target: Target, out: str) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", out, *target.pip_target_args(), *pins]


def resolved(report: dict) -> list[tuple[str, str]]:
    """(name, version) of every package a ``pip install --report`` would install."""
    return [(item["metadata"]["name"], item["metadata"]["version"]) for item in report.get("install", [])]


def keep(name: str, target: Target, have: set[str]) -> bool:
    """False for what the host already has, and for CUDA-flavoured wheels of another CUDA major version."""
    n = normalize(name)
    if HOST_PROVIDED.match(n) or n in have:
        return False
    flavour = CUDA_FLAVOUR.search(n)
    return not flavour or int(flavour.group(1)) == target.cuda


def read_have(path: str | None) -> set[str]:
    """Package names, one a line (``#`` comments and ``==version`` suffixes allowed)."""
    if not path:
        return set()
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(normalize(re.split(r"[=<>!~ \[;]", line)[0]))
    return names


def build_wheelhouse(sets: list[str], out: str, *, target: Target = Target(), extra: Iterable[str] = (),
                     have: set[str] = frozenset(), no_pip_config: bool = False,
                     run: Callable | None = None) -> list[str]:
    """Resolve, filter, download; write ``requirements.txt`` into ``out``. Returns the pinned requirements."""
    run = run or subprocess.run
    reqs = requirements(sets, extra, target.cuda)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull} if no_pip_config else None
    Path(out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        run(resolve_command(reqs, target, report, os.path.join(tmp, "target")), check=True, env=env)
        packages = resolved(json.loads(Path(report).read_text()))
    pins = sorted(f"{name}=={version}" for name, version in packages if keep(name, target, have))
    if not pins:
        raise WheelhouseError("every resolved package is already on the host; nothing to download")
    run(download_command(pins, target, out), check=True, env=env)
    Path(out, "requirements.txt").write_text(
        "# attnbench wheelhouse: " + " ".join(reqs) + f" for CPython {target.python}, glibc >= {target.glibc}, "
        f"{target.machine}, CUDA {target.cuda}\n"
        f"# install offline: pip install --no-index --find-links {out} --no-deps -r {out}/requirements.txt\n"
        + "\n".join(pins) + "\n")
    return pins
