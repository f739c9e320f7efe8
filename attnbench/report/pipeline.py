"""What the Snakemake workflow needs at parse time, kept here so it is importable and tested.

``workflow/rules/common.smk`` calls :func:`default_config` when no config file
was given, then :func:`load_sweep`, which validates the config (one-line
:class:`~attnbench.config.ConfigError` for any problem), resolves the device and
lists the jobs. Nothing here runs a benchmark.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnbench.config import ConfigError, MicrobenchPlan, microbench_plan, resolve_device, validate_config
from attnbench.kernels.registry import backend_names


def default_config(overrides: dict, default_path: str | Path) -> dict:
    """The repository's default sweep with ``--config`` overrides merged in (nested keys merge)."""
    base = yaml.safe_load(Path(default_path).read_text())
    _merge(base, overrides)
    return base


def _merge(base: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


@dataclass(frozen=True)
class Sweep:
    """A validated config with its device resolved, and the jobs it asks for."""

    config: dict  # defaults filled, ``device`` set to the resolved device
    why: str  # why this device's grid was chosen
    plan: MicrobenchPlan
    rule_backends: dict[str, list[str]]  # rule-based backend -> groups it runs

    @property
    def name(self) -> str:
        return self.config["sweep"]

    @property
    def device(self) -> str:
        return self.plan.device

    def jobs(self) -> list[tuple[str, str]]:
        """(backend, group) for Python adapters: one ``attnbench microbench`` job each."""
        return self.plan.jobs()

    def rule_jobs(self) -> list[tuple[str, str]]:
        return [(b, g) for b, groups in self.rule_backends.items() for g in groups]

    def results_files(self, results_dir: str) -> list[str]:
        """Every microbench-shaped results file the aggregate joins, adapters and rule backends alike."""
        return [f"{results_dir}/microbench/{b}/{g}.parquet" for b, g in self.jobs() + self.rule_jobs()]

    def backends(self) -> list[str]:
        return list(dict.fromkeys([b for b, _ in self.jobs()] + list(self.rule_backends)))

    def snapshot(self, folder: str | Path) -> str:
        """Write the effective config as ``<folder>/config-<hash>.json`` (once) and return its path.

        The env rule reads it, so the config travels to the job without a kilobytes-long
        command line; a changed config is a new file name, which reruns the env rule.
        """
        text = json.dumps(self.config, sort_keys=True, indent=1)
        path = Path(folder) / f"config-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return str(path)

    def summary(self) -> str:
        return (f"attnbench: sweep {self.name!r} runs the {self.device} grid ({self.why}): "
                f"{sum(len(c) for c in self.plan.groups.values())} cases in {len(self.plan.groups)} groups, "
                f"{len(self.jobs()) + len(self.rule_jobs())} jobs, backends {', '.join(self.backends())}")

    def wildcard_pattern(self, kind: str) -> str:
        """Regex for the ``backend`` or ``group`` wildcard of the adapter microbench rule."""
        names = [b for b, _ in self.jobs()] if kind == "backend" else list(self.plan.groups)
        return "|".join(re.escape(n) for n in dict.fromkeys(names))


def load_sweep(config: dict, rule_backend_files: list[str], device: str | None = None) -> Sweep:
    """Validate, resolve the device, and check what the schema cannot: rule backends and duplicate cases.

    ``device`` plans that device's grid without asking torch (to check a config meant for another host).
    """
    filled = validate_config(copy.deepcopy(config))
    device, why = (device, f"planned for {device}") if device else resolve_device(filled)
    filled["device"] = device
    plan = microbench_plan(filled, device)
    where = f"microbench.{device}.rule_backends"
    rule_backends = filled["microbench"][device].get("rule_backends", {})
    known = sorted(rule_backend_files)
    clash = sorted(set(rule_backends) & set(backend_names()))
    if clash:
        raise ConfigError(f"{where}: {clash[0]!r} is a Python adapter's name; allowed: a name no adapter uses")
    for name, groups in rule_backends.items():
        if name not in known:
            raise ConfigError(f"{where}: {name!r} has no rule file workflow/rules/backends/{name}.smk; "
                              f"allowed: {', '.join(known) or 'none'}")
        for group in groups:
            if group not in plan.groups:
                raise ConfigError(f"{where}.{name}: group={group!r} is not in microbench.{device}.groups; "
                                  f"allowed: {', '.join(plan.groups)}")
    _check_unique(plan, rule_backends, device)
    return Sweep(filled, why, plan, {k: list(v) for k, v in rule_backends.items()})


def _check_unique(plan: MicrobenchPlan, rule_backends: dict[str, list[str]], device: str) -> None:
    """A (case, backend) measured in two groups would be two rows for one table cell."""
    seen: dict[tuple[str, str], str] = {}
    pairs = plan.jobs() + [(b, g) for b, groups in rule_backends.items() for g in groups]
    for backend, group in pairs:
        for case in plan.groups[group]:
            other = seen.setdefault((case.case_id, backend), group)
            if other != group:
                raise ConfigError(f"microbench.{device}.groups: case {case.label()!r} runs on {backend} in both "
                                  f"{other!r} and {group!r}; allowed: each (case, backend) in one group "
                                  "(narrow a group with its own backends list)")
