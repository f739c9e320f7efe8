"""Load and check a sweep config: schema first, then backend names and case grids.

Everything that can be wrong with a config is reported here, before any job
starts, as one line naming the key and the allowed values.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import jsonschema
import torch
import yaml

from attnbench.bench.case import Case
from attnbench.bench.grid import expand_groups
from attnbench.kernels.registry import backend_names

SCHEMA_PATH = files("attnbench") / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming the key."""


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


SECTIONS = ("hbm", "pretrain", "context", "report")  # each validated by schemas/<section>.schema.yaml


def section_schema(section: str) -> dict | None:
    """The schema of a top-level config section (schemas/<section>.schema.yaml); None if it has none."""
    path = files("attnbench") / "schemas" / f"{section}.schema.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def section_defaults(section: str) -> dict:
    """A section as a config that leaves it out gets it: the schema's defaults, filled in."""
    return _with_defaults({}, section_schema(section))


def validate_section(value: dict, schema: dict, where: str) -> dict:
    """Check ``value`` against ``schema`` and return it with the schema's defaults filled in.

    ``where`` is the value's dotted key in the config (``hbm``, ``context.capability.cuda``; ``""``
    for the whole config); the ConfigError names the offending key below it, e.g. ``hbm.ledger.batch: ...``.
    """
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_schema_message(errors[0], where))
    return _with_defaults(value, schema)


def _with_defaults(instance: dict, schema: dict) -> dict:
    """Fill ``default`` values of the schema's properties (what snakemake.utils.validate does)."""
    out = dict(instance)
    for key, sub in schema.get("properties", {}).items():
        if key not in out and "default" in sub:
            out[key] = sub["default"]
        if isinstance(out.get(key), dict) and sub.get("type") == "object":
            out[key] = _with_defaults(out[key], sub)
    return out


def _schema_message(err: jsonschema.ValidationError, root: str = "") -> str:
    """One line naming the key: ``root`` (the validated value's own key, if any) joined to the error's path."""
    where = ".".join(str(p) for p in [*([root] if root else []), *err.absolute_path]) or "config"
    if err.validator == "additionalProperties":
        allowed = ", ".join(err.schema.get("properties", {})) or "none"
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"{where}: unknown key {extra[0]!r}; allowed: {allowed}"
    if err.validator == "enum":
        return f"{where}={err.instance!r} is not allowed; allowed: {', '.join(map(str, err.validator_value))}"
    return f"{where}: {err.message}"


def validate_config(config: dict) -> dict:
    """Schema-check (with defaults), then check backends and expand every grid. Returns the filled config."""
    if not isinstance(config, dict):
        raise ConfigError("config must be a mapping; see config/README.md")
    config = validate_section(config, load_schema(), "")
    for section in SECTIONS:
        sub = section_schema(section)
        if sub is not None:
            config[section] = validate_section(config.get(section, {}), sub, section)
    known = backend_names()
    for device in config["microbench"]:
        lists = {f"microbench.{device}.backends": config["microbench"][device]["backends"]}
        for group, grid in config["microbench"][device]["groups"].items():
            if isinstance(grid, dict) and "backends" in grid:
                lists[f"microbench.{device}.groups.{group}.backends"] = grid["backends"]
        for where, names in lists.items():
            if not isinstance(names, list) or not names:
                raise ConfigError(f"{where} must be a non-empty list; allowed: {', '.join(known)}")
            for name in names:
                if name not in known:
                    raise ConfigError(f"{where}: backend={name!r} is not known; allowed: {', '.join(known)}")
        try:
            microbench_plan(config, device)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return config


def load_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    return validate_config(config)


def resolve_device(config: dict) -> tuple[str, str]:
    """(device, why): ``auto`` picks cuda when torch sees a CUDA device."""
    wanted = config.get("device", "auto")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; allowed here: auto, cpu")
    if wanted != "auto":
        return wanted, f"device: {wanted} in the config"
    if torch.cuda.is_available():
        return "cuda", f"device: auto, and torch sees {torch.cuda.get_device_name()}"
    return "cpu", f"device: auto, and torch {torch.__version__} sees no CUDA device"


@dataclass(frozen=True)
class MicrobenchPlan:
    """A device's grid: cases per group, and the backends that run each group."""

    device: str
    backends: list[str]
    groups: dict[str, list[Case]]
    group_backends: dict[str, list[str]]

    def jobs(self) -> list[tuple[str, str]]:
        """(backend, group) pairs: one workflow job each."""
        return [(b, g) for g in self.groups for b in self.group_backends[g]]


def microbench_plan(config: dict, device: str) -> MicrobenchPlan:
    """Expand a device's groups; a group's own ``backends`` list narrows the device-wide one."""
    plan = config["microbench"][device]
    grids, group_backends = {}, {}
    for group, grid in plan["groups"].items():
        grid = dict(grid) if isinstance(grid, dict) else grid
        group_backends[group] = list(grid.pop("backends", plan["backends"])) if isinstance(grid, dict) else []
        grids[group] = grid
    return MicrobenchPlan(device, list(plan["backends"]), expand_groups(grids, f"microbench.{device}.groups"), group_backends)
