"""Merge the microbench or context-cost groups a lease brought back into a committed reference folder.

``scripts/lease.sh`` packs what a sweep made as ``$OUT/<sweep>.tar.gz`` (``results/<sweep>/`` with the call's
Snakemake log inside). A group measured on a later lease (``lease.sh <sweep>:<group>``) replaces that group's
rows in ``results/reference/<gpu>/<folder>/microbench.parquet`` (a context sweep's cost group: in its
``cost.parquet``), and its provenance goes beside them, never over the earlier run's (docs/reference-runs.md,
"Back here")::

    attnbench reference-merge h200-triton.tar.gz --into results/reference/h200/triton --groups fwd_bwd --gpu gpu.txt

* only groups whose job finished are merged: one stopped at a deadline (its ``.interrupted`` marker,
  :mod:`attnbench.workflow.resume`) is refused, so a reference never holds "not run" rows that a resume would fill;
* rows from a tree with uncommitted changes (``git_sha`` ``<sha>-dirty``) or without git are refused;
* the other groups' rows are kept as they are; the merged table is validated and written atomically;
* the pack's Snakemake log becomes ``snakemake-<n>.log``, one past the folder's highest, its ``env/`` becomes
  ``env-<sha>/`` and the GPU record (``--gpu``, the call's ``$OUT/gpu.txt``) ``gpu-<sha>.txt``; each group's
  Snakemake benchmark replaces ``benchmarks/microbench/<group>.tsv`` (``benchmarks/context-cost/<group>.tsv``);
* a context folder's tables are then stale: ``attnbench reference sweep`` writes them again.

The pack is unpacked into a temporary folder first, member by member checked: only regular files and folders
under ``results/<sweep>/`` (and ``reports/<sweep>/``, which is not extracted) with plain names, nothing
absolute, no ``..``, no links.
"""
from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import pandas as pd

from attnbench.bench.results import ResultsError, to_frame, write_atomic
from attnbench.files import REFERENCE_ROOT, folder_under
from attnbench.report.aggregate import load_results
from attnbench.workflow import paths
from attnbench.workflow.resume import marker_path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _members(pack: tarfile.TarFile, source: str) -> list[tarfile.TarInfo]:
    """The pack's members, each checked before anything is written; one line naming the first bad one."""
    members = pack.getmembers()
    for m in members:
        parts = PurePosixPath(m.name).parts
        if not (m.isfile() or m.isdir()) or m.name.startswith("/") or not parts \
                or parts[0] not in ("results", "reports") or not all(_NAME.match(p) for p in parts):
            raise ResultsError(f"{source}: member {m.name!r} is not allowed; allowed: regular files and folders "
                               "under results/<sweep>/ and reports/<sweep>/ with names of letters, digits, '.', "
                               "'_', '-'")
    return members


def unpack(pack_path: str | Path, into: Path) -> Path:
    """Unpack a lease's pack into ``into``; returns its ``results/<sweep>`` folder (exactly one)."""
    pack_path = Path(pack_path)
    if not pack_path.is_file():
        raise ResultsError(f"{pack_path}: pack does not exist")
    try:
        with tarfile.open(pack_path, "r:*") as pack:
            members = _members(pack, str(pack_path))
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            # every member checked, only the results extracted (the rendered report is not merged)
            pack.extractall(into, members=[m for m in members if PurePosixPath(m.name).parts[0] == "results"], **kwargs)
    except tarfile.TarError as err:
        raise ResultsError(f"{pack_path}: not a readable pack ({err})") from None
    sweeps = sorted(p for p in (into / "results").iterdir() if p.is_dir()) if (into / "results").is_dir() else []
    if len(sweeps) != 1:
        raise ResultsError(f"{pack_path}: holds {len(sweeps)} sweep folders under results/; allowed: exactly one")
    return sweeps[0]


# the reference folder's table per stage whose groups a lease measures alone (paths.group_results): a sweep
# folder's merged microbench rows, or a context folder's cost rows (it holds the context stage's files at its top)
TABLES = {"microbench": Path(paths.MERGED).name, "context-cost": Path(paths.CONTEXT_COST_ALL).name}


def _group_rows(sweep: Path, groups: list[str] | None) -> dict[str, tuple[str, Path]]:
    """``{group: (stage, rows file)}`` of the pack; a microbench group wins a name that both stages have."""
    found: dict[str, tuple[str, Path]] = {}
    for stage in TABLES:
        pattern = paths.within(sweep, paths.group_results(stage), group="*")
        for path in sorted(pattern.parent.glob(pattern.name)):
            found.setdefault(path.name[: -len(".parquet")], (stage, path))
    for name in groups or []:
        if name not in found:
            raise ResultsError(f"group={name!r} is not in the pack; allowed: {', '.join(found) or 'none'}")
    chosen = {g: found[g] for g in (groups or found)}
    for name, (_, path) in chosen.items():
        if marker_path(path).exists():
            raise ResultsError(f"group={name!r} stopped before it finished (its job left {marker_path(path).name}); "
                               "resume it on a lease first, then merge the pack that call returns")
    return chosen


def _commit(rows: pd.DataFrame, source: str) -> str:
    shas = sorted(set(rows["git_sha"].astype(str)))
    bad = [s for s in shas if s.endswith("-dirty") or not re.fullmatch(r"[0-9a-f]{7,40}", s)]
    if bad:
        raise ResultsError(f"{source}: rows with git_sha {bad[0]!r} are not allowed as reference; allowed: rows "
                           "measured at a clean commit")
    return shas[-1][:7] if len(shas) == 1 else "-".join(s[:7] for s in shas)


def _next_log(folder: Path) -> Path:
    """The log after the folder's latest (one past the highest ``snakemake-<n>.log``): the numbers keep call
    order."""
    if not (folder / "snakemake.log").exists():
        return folder / "snakemake.log"
    taken = [int(m.group(1)) for log in folder.glob("snakemake-*.log")
             if (m := re.fullmatch(r"snakemake-(\d+)\.log", log.name))]
    return folder / f"snakemake-{max(taken, default=0) + 1}.log"


def merge(pack: str | Path, into: str | Path, groups: list[str] | None = None,
          gpu: str | Path | None = None) -> dict[str, int]:
    """Merge ``groups`` (default: every finished group in the pack) into the reference folder ``into``.

    Returns the number of rows merged per group. Everything is checked before the folder is touched.
    """
    folder = folder_under(REFERENCE_ROOT, into, "--into", "results/reference/<gpu>/<folder>", 4, ResultsError)
    if gpu is not None and not Path(gpu).is_file():
        raise ResultsError(f"--gpu={str(gpu)!r}: file does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        sweep = unpack(pack, Path(tmp))
        chosen = _group_rows(sweep, groups)
        if not chosen:
            raise ResultsError(f"{pack}: no microbench or context-cost group to merge")
        new = {stage: load_results([p for s, p in chosen.values() if s == stage]) for stage, _ in chosen.values()}
        every_new = pd.concat(list(new.values()))
        sha = _commit(every_new, str(pack))
        merged = {}
        for stage, rows in new.items():  # every table checked before any is written
            table = folder / TABLES[stage]
            kept = load_results([table]) if table.exists() else rows.iloc[:0]
            replaced = [g for g, (s, _) in chosen.items() if s == stage]
            merged[table] = to_frame(pd.concat([kept[~kept["group"].isin(replaced)], rows], ignore_index=True))
            if merged[table].duplicated(["case_id", "backend"]).any():
                raise ResultsError(f"{pack}: a (case, backend) pair of the pack is already in another group of {table}")
        for table, frame in merged.items():
            write_atomic(frame, table)
        log = sweep / "snakemake.log"
        if log.is_file():
            shutil.copyfile(log, _next_log(folder))
        env = paths.within(sweep, paths.ENV)
        if env.is_dir():
            shutil.copytree(env, folder / f"env-{sha}", dirs_exist_ok=True)
        if gpu is not None:
            shutil.copyfile(gpu, folder / f"gpu-{sha}.txt")
        for name, (stage, _) in chosen.items():
            bench = paths.within(sweep, paths.JOB_BENCHMARK, stage=stage, name=name)
            if bench.is_file():
                target = folder / bench.relative_to(sweep)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(bench, target)
    counts = every_new["group"].value_counts()
    return {name: int(counts.get(name, 0)) for name in chosen}
