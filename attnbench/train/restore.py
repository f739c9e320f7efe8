"""Finished pretraining runs put back into their run folders from an experiment's committed rows.

A long experiment can outlast one GPU session: a lease's pack keeps finished runs, but a later session's
cold machine has only the repository, and the finished runs' rows are in it once they are committed
(``results/reference/<gpu>/<folder>/pretrain/<experiment>/``). :func:`restore_finished_runs` writes each
such run's folder as training left it, so :func:`attnbench.train.experiments.run_experiment` keeps it (a
folder whose ``summary.json`` carries the config hash the plan gives the run now is not trained again) and
trains only the runs still missing:

* ``summary.json`` is the run's row of ``runs.parquet`` (the summary it wrote, with its tags);
* ``steps.parquet`` and ``fp8_layers.parquet`` are the run's rows of the experiment's frames, less the tag
  columns the experiment adds when it joins the runs (a column only other runs filled stays, empty: joined
  again, the frames have the columns they had).

Only runs that finished (``ok``, ``diverged``) with the config hash their plan gives them now are put back: a
run cut short (``truncated``) continues from its checkpoint, which rows do not hold, so it trains from step 0;
a changed config is a different run. A folder this machine already has is left as it is. Divergence is
refused: its pairs need the runs' weight snapshots, which rows do not hold either (a lease's pack carries
that experiment: docs/reference-runs.md).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.bench.results import write_atomic
from attnbench.errors import ConfigError
from attnbench.files import REFERENCE_ROOT, RESULTS_ROOT, folder_under, read_parquet
from attnbench.train.experiments import EXPERIMENTS, run_dir
from attnbench.train.loop import RunSpec, write_json

FINISHED = ("ok", "diverged")


def reference_rows(rows: str | Path) -> Path:
    """``rows`` if it is an experiment's folder of committed rows, ``results/reference/<gpu>/<folder>/.../<experiment>``
    (relative, no ``..``); else one line naming the allowed form."""
    return folder_under(REFERENCE_ROOT, rows, "--rows",
                        "results/reference/<gpu>/<folder>/pretrain/<experiment> holding runs.parquet", 5, ConfigError)


def experiment_folder(out: str | Path, experiment: str) -> Path:
    """``out`` if it is a sweep's folder of ``experiment``, ``results/<sweep>/pretrain/<experiment>`` (relative, no
    ``..``, not under the committed reference rows): where the experiment's job trains (the pipeline's path,
    passed in by its caller); else one line naming the allowed form."""
    form = f"results/<sweep>/pretrain/{experiment} (a sweep's folder, not results/reference/)"
    folder = folder_under(RESULTS_ROOT, out, "--out", form, 4, ConfigError)
    if len(folder.parts) != 4 or folder.parts[1] == REFERENCE_ROOT.name or folder.parts[2:] != ("pretrain", experiment):
        raise ConfigError(f"--out={str(out)!r} is not allowed; allowed: a folder {form}")
    return folder


def _plain(value):
    """A value of a parquet row as JSON writes it: numpy scalars as Python's, NaN kept (as the summary had it)."""
    return value.item() if isinstance(value, np.generic) else value


def restore_finished_runs(experiment: str, specs: list[RunSpec], rows: str | Path, out_dir: str | Path) -> list[str]:
    """Write the run folders of ``specs``' finished runs from the committed rows in ``rows`` into ``out_dir`` (the
    experiment's folder, ``results/<sweep>/pretrain/<experiment>``); return the names of the runs put back."""
    if experiment == "divergence":
        raise ConfigError("experiment='divergence' cannot be restored from rows (its pairs need the runs' weight "
                          f"snapshots); allowed: {', '.join(e for e in EXPERIMENTS if e != 'divergence')}")
    rows = reference_rows(rows)
    runs = read_parquet(rows / "runs.parquet")
    steps = read_parquet(rows / "steps.parquet")
    layers = read_parquet(rows / "fp8_layers.parquet") if (rows / "fp8_layers.parquet").is_file() else pd.DataFrame()
    committed = {r["run"]: r for r in runs.to_dict("records")}
    restored = []
    for spec in specs:
        row = committed.get(spec.name)
        folder = run_dir(out_dir, spec)
        if row is None or row.get("status") not in FINISHED or row.get("config_hash") != spec.config_hash \
                or (folder / "summary.json").exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for frame, name in ((steps, "steps.parquet"), (layers, "fp8_layers.parquet")):
            own = frame[frame["run"] == spec.name] if len(frame) else frame
            if len(own):
                write_atomic(own.drop(columns=[t for t in spec.tags if t in own]).reset_index(drop=True), folder / name)
        write_json({k: _plain(v) for k, v in row.items()}, folder / "summary.json")  # last: it marks the run done
        restored.append(spec.name)
    return restored
