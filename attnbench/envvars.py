"""Every environment variable attnbench reads, checked in one place before any work.

:func:`check_environment` is called at Snakemake parse time (``workflow/rules/common.smk``) and by every
``attnbench`` command (``attnbench.cli.main``), so a malformed value is one line naming the variable and
the allowed values, not a traceback in the middle of a sweep. It returns the parsed values; the modules
that use a variable read it through here (:func:`deadline`: the guard, the training experiments and the
context-parallel launcher honour the same sweep deadline).

Variables read by the libraries themselves (``WANDB_API_KEY``: wandb reads it, attnbench never does;
``TRITON_INTERPRET``: Triton's own switch) are not checked here.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Mapping

from attnbench.errors import ConfigError

WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # wandb.Settings.mode
DEVICE_ID = re.compile(r"^(-?[0-9]+|(GPU|MIG)-[0-9A-Za-z-]+)$")  # an index or a UUID (nvidia-smi -L)
GIT_SHA = re.compile(r"^[0-9a-f]{7,40}(-dirty)?$")
SLURM_JOB = re.compile(r"^[0-9]+(_[0-9]+)?$")  # a job id, or an array job's <id>_<index>

def _deadline(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"ATTNBENCH_DEADLINE={value!r} is not allowed; allowed: a Unix time in seconds, "
                          "e.g. $(( $(date +%s) + 3600 )) for an hour from now")
    return number


def _lock_dir(value: str) -> Path:
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"ATTNBENCH_LOCK_DIR={value!r} is not a folder; allowed: a folder (created if missing)")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"ATTNBENCH_LOCK_DIR={value!r} is not writable; allowed: a folder this user can write")
    return path


def _visible_devices(value: str) -> list[str]:
    entries = [e.strip() for e in value.split(",") if e.strip()]
    for entry in entries:
        if not DEVICE_ID.match(entry):
            raise ConfigError(f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} is not allowed; allowed: comma-separated "
                              "device indices or GPU-/MIG- UUIDs (nvidia-smi -L)")
    return entries


def _slurm_job(value: str) -> str:
    if not SLURM_JOB.match(value):
        raise ConfigError(f"SLURM_JOB_ID={value!r} is not allowed; allowed: a SLURM job id (digits), as sbatch sets it")
    return value


def _slurm_gpus(name: str):
    def check(value: str) -> list[str]:
        entries = [e.strip() for e in value.split(",") if e.strip()]
        if not all(e.isdigit() for e in entries):
            raise ConfigError(f"{name}={value!r} is not allowed; allowed: comma-separated GPU indices, as SLURM sets it")
        return entries

    return check


def _git_sha(value: str) -> str:
    if not GIT_SHA.match(value):
        raise ConfigError(f"ATTNBENCH_GIT_SHA={value!r} is not allowed; allowed: 7-40 lowercase hex digits, "
                          "optionally -dirty (git rev-parse --short=12 HEAD)")
    return value


def _wandb_mode(value: str) -> str:
    if value not in WANDB_MODES:
        raise ConfigError(f"WANDB_MODE={value!r} is not allowed; allowed: {', '.join(WANDB_MODES)}")
    return value


DEADLINE_ENV = "ATTNBENCH_DEADLINE"  # the sweep deadline (:func:`deadline`)

# name: (check, what it is); docs/security.md lists them
VARIABLES = {
    DEADLINE_ENV: (_deadline, "Unix time after which no results job starts, and running ones stop"),
    "ATTNBENCH_LOCK_DIR": (_lock_dir, "folder of the GPU lease lock files (default: <tmp>/attnbench-gpu-locks)"),
    "ATTNBENCH_GIT_SHA": (_git_sha, "the commit every row records, for copies without .git"),
    "CUDA_VISIBLE_DEVICES": (_visible_devices, "the GPUs a job may lease: comma-separated indices or UUIDs"),
    "SLURM_JOB_ID": (_slurm_job, "set by SLURM in its jobs: the job's GPUs are SLURM's (no local GPU lease)"),
    "SLURM_STEP_GPUS": (_slurm_gpus("SLURM_STEP_GPUS"), "the node's GPUs SLURM gave this job step"),
    "SLURM_JOB_GPUS": (_slurm_gpus("SLURM_JOB_GPUS"), "the node's GPUs SLURM gave this job"),
    "WANDB_MODE": (_wandb_mode, "wandb's mode for `snakemake publish` (default: online with a key, else offline)"),
}


def check_environment(env: Mapping[str, str] | None = None) -> dict:
    """The parsed value of each variable of :data:`VARIABLES` (None where unset or empty, except
    ``CUDA_VISIBLE_DEVICES``, where empty means no GPU); one-line :class:`ConfigError` for a bad one."""
    env = os.environ if env is None else env
    out = {}
    for name, (check, _) in VARIABLES.items():
        value = env.get(name)
        if value is None or (value == "" and name != "CUDA_VISIBLE_DEVICES"):
            out[name] = None
        else:
            out[name] = check(value)
    return out


def deadline() -> float | None:
    """``$ATTNBENCH_DEADLINE`` as Unix time, or None where unset (only this variable is checked)."""
    return check_environment({DEADLINE_ENV: os.environ.get(DEADLINE_ENV, "")})[DEADLINE_ENV]
