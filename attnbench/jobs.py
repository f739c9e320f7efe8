"""One Snakemake job's work, as data: what :mod:`attnbench.plan` and each stage's own planner return.

Below the planners, so that a stage's planner (:mod:`attnbench.context.cost`, :mod:`attnbench.context.experiment`,
:mod:`attnbench.parallel.plan`) builds its jobs without importing the planner that calls it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    """One Snakemake job's work: ``plan/<stage>/<name>.json`` holds :attr:`payload`."""

    stage: str
    name: str
    payload: dict

    def path(self, plan_dir: str | Path) -> Path:
        return Path(plan_dir) / self.stage / f"{self.name}.json"
