"""The ``hbm:`` config section as groups of cases and the backends that profile them.

A group is one grid (the keys of :data:`attnbench.bench.grid.GRID_KEYS`), or a
list of grids under ``grids`` when shapes must move together (B*S fixed while S
grows is three grids, not a product). An optional ``backends`` list narrows
``hbm.backends`` for that group. One ``attnbench hbm`` job runs one group for
one or more backends.
"""
from __future__ import annotations

from dataclasses import dataclass

from attnbench.bench.case import Case, CaseError
from attnbench.bench.grid import GridError, expand_grid, unique_cases
from attnbench.config import ConfigError
from attnbench.kernels.registry import backend_names


@dataclass(frozen=True)
class HbmPlan:
    groups: dict[str, list[Case]]
    group_backends: dict[str, list[str]]

    def jobs(self) -> list[tuple[str, str]]:
        """(group, backend) pairs: one workflow job, and one Nsight Compute process, each."""
        return [(g, b) for g in self.groups for b in self.group_backends[g]]


def _check_backends(names, where: str, known: list[str]) -> list[str]:
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{where} must be a non-empty list; allowed: {', '.join(known)}")
    for name in names:
        if name not in known:
            raise ConfigError(f"{where}: backend={name!r} is not known; allowed: {', '.join(known)}")
    return list(names)


def _group_cases(name: str, group: dict) -> list[Case]:
    where = f"hbm.groups.{name}"
    grid = {k: v for k, v in group.items() if k != "backends"}
    grids = grid.pop("grids", None)
    if grids is None:
        grids = [grid]
    elif grid:
        raise ConfigError(f"{where}: grid key {sorted(grid)[0]!r} next to grids; allowed: either grid keys or grids")
    cases = []
    try:
        for i, one in enumerate(grids):
            cases += expand_grid(one, f"{where}.grids.{i}" if "grids" in group else where)
    except (GridError, CaseError) as err:
        raise ConfigError(str(err)) from None
    return unique_cases(cases)


def hbm_plan(config: dict) -> HbmPlan:
    """Expand ``config['hbm']`` (schema defaults already filled by :func:`attnbench.config.load_config`)."""
    section = config["hbm"]
    known = backend_names()
    default_backends = _check_backends(section["backends"], "hbm.backends", known)
    groups, group_backends = {}, {}
    for name, group in section["groups"].items():
        groups[name] = _group_cases(name, group)
        group_backends[name] = (_check_backends(group["backends"], f"hbm.groups.{name}.backends", known)
                                if "backends" in group else default_backends)
    return HbmPlan(groups, group_backends)


def select_group(plan: HbmPlan, group: str) -> list[Case]:
    if group not in plan.groups:
        raise ConfigError(f"group={group!r} is not in hbm.groups; allowed: {', '.join(plan.groups)}")
    return plan.groups[group]
