"""One planner: a validated config -> the jobs of every stage, as data.

The only place that reads a config's stage sections. Everything a job needs is decided here, at
Snakemake parse time (or once in a command-line call), and written as one JSON file per job under
``results/<sweep>/plan/``; a job reads its file and never the YAML again.

* **The device view** (:func:`device_view`): the config as one device sees it. ``microbench`` and
  ``context.cost`` hold a grid per device; ``pretrain`` and ``context.capability`` hold CPU-sized
  settings with a ``cuda`` block merged over them on a GPU (checked against the section's schema).
* **One grid syntax** (:func:`attnbench.workloads.grid.expand_group`): a group is a grid, or
  ``grids: [...]`` for shapes that move together, with an optional ``backends`` list.
* **One backend check** (:func:`check_backends`): every backend name in every section, checked
  against the registry with the allowed names in the message.
* **One group lookup** (:meth:`Plan.group`) and **one way to build run options** (:func:`run_options`).

:func:`check_config` plans every device (a CPU host checks the ``cuda`` blocks too);
:func:`build_plan` keeps the one that runs.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.case import Case, CaseError
from attnbench.config import deep_merge, load_schema, resolve_device, validate_section
from attnbench.errors import ConfigError, check_backend_names, check_name
from attnbench.jobs import Job
from attnbench.kernels.registry import backend_names
from attnbench.workloads.grid import GridError, expand_group

DEVICES = ("cpu", "cuda")
STAGES = ("microbench", "stability", "hbm", "pretrain", "context", "triton", "context_parallel")  # data-flow order


@dataclass(frozen=True)
class Group:
    """Cases that one job runs, and the backends it runs them on."""

    name: str
    cases: tuple[Case, ...]
    backends: tuple[str, ...]


# ----------------------------------------------------------------------------------------------- checks

def check_backends(names, where: str, known: list[str] | None = None) -> list[str]:
    """A group's backends: a non-empty list of registered names (a rule backend's name is not one)."""
    return check_backend_names(names, backend_names() if known is None else known, where)


def grid_groups(section: dict, where: str, max_cases: int) -> dict[str, Group]:
    """``{backends, groups}`` -> groups of cases with their backends, for any grid stage."""
    known = backend_names()
    default = check_backends(section.get("backends"), f"{where}.backends", known)
    groups = section.get("groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}.groups must be a non-empty mapping of group name to grid")
    out = {}
    for name, spec in groups.items():
        place = f"{where}.groups.{check_name(name, f'{where}.groups')}"
        try:
            cases, backends = expand_group(spec, place, max_cases)
        except (GridError, CaseError) as err:
            raise ConfigError(str(err)) from None
        if backends is not None:
            backends = check_backends(backends, f"{place}.backends", known)
        out[name] = Group(name, tuple(cases), tuple(backends or default))
    total = sum(len(g.cases) for g in out.values())
    if total > max_cases:
        raise ConfigError(f"{where}: {total} cases over its groups; allowed: at most max_cases={max_cases}")
    return out


def _unique_pairs(groups: dict[str, Group], extra: dict[str, list[str]], where: str) -> None:
    """A (case, backend) measured in two groups would be two rows for one table cell."""
    seen: dict[tuple[str, str], str] = {}
    pairs = [(g.name, b) for g in groups.values() for b in g.backends]
    pairs += [(group, b) for b, names in extra.items() for group in names]
    for group, backend in pairs:
        for case in groups[group].cases:
            other = seen.setdefault((case.case_id, backend), group)
            if other != group:
                raise ConfigError(f"{where}: case {case.label()!r} runs on {backend} in both {other!r} and {group!r}; "
                                  "allowed: each (case, backend) in one group (narrow a group with its own backends list)")


# ----------------------------------------------------------------------------------------------- device view

def _merged_section(section: dict, schema: dict, where: str, device: str) -> dict:
    """A settings section with its ``cuda`` block merged over it on a GPU, checked against its schema again."""
    spec = copy.deepcopy(section)
    cuda = spec.pop("cuda", {})
    if device != "cuda" or not cuda:
        return spec
    schema = dict(schema)
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k != "cuda"}
    validate_section(cuda, schema, f"{where}.cuda")  # its own keys, named where they are written
    return validate_section(deep_merge(spec, cuda), schema, f"{where} (with {where}.cuda merged over it)")


def device_view(config: dict, device: str) -> dict:
    """The config as ``device`` sees it: one grid per grid stage, the ``cuda`` blocks merged on a GPU."""
    view = copy.deepcopy(config)
    view["device"] = device
    view["microbench"] = config["microbench"][device]
    view["context"]["cost"] = config["context"]["cost"][device]
    view["pretrain"] = _merged_section(config["pretrain"], load_schema("pretrain"), "pretrain", device)
    capability_schema = load_schema("context")["properties"]["capability"]
    view["context"]["capability"] = _merged_section(config["context"]["capability"], capability_schema,
                                                    "context.capability", device)
    cp = dict(config["context_parallel"])
    if device == "cuda" and "groups" in cp.get("cuda", {}):
        cp.pop("groups")  # a cuda block's groups replace the CPU groups instead of merging into them
    view["context_parallel"] = _merged_section(cp, load_schema("context_parallel"), "context_parallel", device)
    return view


DEFAULT_REPEATS = {"cpu": 3, "cuda": 5}  # timing.repeats: null


def run_options(view: dict, **overrides) -> dict:
    """The one place a timed job's options come from (``attnbench.bench.microbench.RunOptions`` fields)."""
    timing = view["timing"]
    options = {"sweep": view["sweep"], "device": view["device"], "numerics": view["numerics"],
               "max_err_ratio": view["max_err_ratio"], "seed": view["seed"], "warmup_ms": timing["warmup_ms"],
               "rep_ms": timing["rep_ms"], "cpu_min_run_time_s": timing["cpu_min_run_time_s"],
               "min_reps": timing["min_reps"], "repeats": timing["repeats"] or DEFAULT_REPEATS[view["device"]],
               **{k: timing[k] for k in ("discard_throttled", "cooldown_ms", "energy_ms", "telemetry_ms")}}
    options.update(overrides)
    return options


# ----------------------------------------------------------------------------------------------- the plan

@dataclass
class Plan:
    """Every stage's jobs for one device. Build it with :func:`build_plan`."""

    config: dict  # the validated config, ``device`` resolved
    view: dict  # :func:`device_view` of it
    why: str  # why this device
    microbench: dict[str, Group] = field(default_factory=dict)
    rule_backends: dict[str, list[str]] = field(default_factory=dict)
    stability: dict[str, Group] = field(default_factory=dict)
    hbm: dict[str, Group] = field(default_factory=dict)
    context_cost: dict[str, Group] = field(default_factory=dict)
    capability: dict | None = None
    pretrain: dict[str, object] = field(default_factory=dict)  # experiment -> train.experiments.ExperimentPlan
    planned_runs: list[str] = field(default_factory=list)  # every run this device plans, its stage run or not
    triton: dict[str, Group] = field(default_factory=dict)
    context_parallel: list = field(default_factory=list)  # Jobs, one per world size (attnbench.parallel.plan)

    @property
    def sweep(self) -> str:
        return self.config["sweep"]

    @property
    def device(self) -> str:
        return self.view["device"]

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(s for s in STAGES if s in self.config["stages"])

    def group(self, stage: str, name: str) -> Group:
        """The one group lookup: a one-line error with the allowed names for an unknown group."""
        groups = self.groups(stage)
        if name not in groups:
            raise ConfigError(f"group={name!r} is not a {stage} group of sweep {self.sweep!r} on {self.device}; "
                              f"allowed: {', '.join(groups) or 'none'}")
        return groups[name]

    def lease_group(self, name: str) -> tuple[str, str]:
        """``(stage, name)`` for a group that ``scripts/lease.sh <sweep>:<group>`` names: a microbench group
        where the sweep runs that stage, else a context-cost group where it runs the context stage, else a
        pretraining experiment where it runs pretraining."""
        named = {stage: names for stage, runs, names in (("microbench", "microbench", self.microbench),
                                                         ("context-cost", "context", self.context_cost),
                                                         ("pretrain", "pretrain", self.pretrain))
                 if runs in self.stages}
        for stage, names in named.items():
            if name in names:
                return stage, name
        allowed = [g for names in named.values() for g in names]
        raise ConfigError(f"group={name!r} is not a {' or '.join(named) or 'results'} group of sweep "
                          f"{self.sweep!r} on {self.device}; allowed: {', '.join(allowed) or 'none'}")

    def groups(self, stage: str) -> dict[str, Group]:
        """The groups of a results stage (``microbench``, ``microbench-rule``, ``stability``, ``hbm``,
        ``context-cost``), by name."""
        return {"microbench": self.microbench, "microbench-rule": self.microbench, "stability": self.stability,
                "hbm": self.hbm, "context-cost": self.context_cost}[stage]

    # --------------------------------------------------------------------------- jobs

    def results_job(self, stage: str, group: str, backends=None, name: str | None = None, **extra) -> Job:
        """A job that writes results rows: ``group``'s cases on ``backends`` (default: the group's).

        ``stage`` is the job's stage (``microbench``, ``microbench-rule``, ``stability``, ``hbm``,
        ``context-cost``); the groups of the last two come from their own sections.
        ``extra`` adds stage settings to the payload (``hbm``: the Nsight Compute settings).
        """
        found = self.group(stage, group)
        # only timing is examined by these stages: no fp64 reference
        numerics = {"hbm": False, "context-cost": False, "stability": False}.get(stage, self.view["numerics"])
        limit = self.view["job_time_limit_s"]  # read by attnbench guard; left out when unset (job files unchanged)
        payload = {"stage": stage, "sweep": self.sweep, "device": self.device, "group": group,
                   "backends": list(backends or found.backends), "cases": [c.fields() for c in found.cases],
                   "options": run_options(self.view, group=group, numerics=numerics),
                   **({"time_limit_s": limit} if limit else {}), **extra}
        return Job(stage, name or group, payload)

    def hbm_parts(self) -> list[tuple[str, list[str]]]:
        """(group, backends) of each hbm job. On a GPU one job (one ncu process) per backend, so a backend
        that hangs costs only its job; without one nothing is profiled, and one job per group writes every
        backend's unavailable rows."""
        if self.device == "cuda":
            return [(g.name, [b]) for g in self.hbm.values() for b in g.backends]
        return [(g.name, list(g.backends)) for g in self.hbm.values()]

    def hbm_job(self, group: str, backends: list[str] | None = None) -> Job:
        """An hbm job: its cases, backends and Nsight Compute settings (``<group>/<backend>``, or
        ``<group>/all`` for several backends in one process)."""
        backends = list(backends or self.group("hbm", group).backends)
        name = f"{group}/{backends[0] if len(backends) == 1 else 'all'}"
        return self.results_job("hbm", group, backends, name=name,
                                hbm={k: self.view["hbm"][k] for k in HBM_JOB_KEYS})

    def jobs(self) -> list[Job]:
        """Every job of the planned stages, in data-flow order."""
        out = [self.results_job("microbench", g) for g in self.microbench]
        for backend, groups in self.rule_backends.items():
            out += [self.results_job("microbench-rule", g, [backend], name=f"{backend}/{g}") for g in groups]
        processes = self.view["stability"]["processes"]
        out += [self.results_job("stability", g, name=f"{g}/{i}") for g in self.stability
                for i in range(1, processes + 1)]
        out += [self.hbm_job(group, backends) for group, backends in self.hbm_parts()]
        if self.hbm:
            out.append(Job("hbm", "ledger", {"stage": "hbm-ledger", "sweep": self.sweep,
                                             "ledger": self.view["hbm"]["ledger"]}))
        out += [self.results_job("context-cost", g) for g in self.context_cost]
        if self.capability is not None:
            from attnbench.context.cost import rope_overhead_job
            from attnbench.context.experiment import capability_jobs

            out += capability_jobs(self.capability, self.sweep, self.device)
            out.append(rope_overhead_job(self.context_cost, self.capability, self.sweep, self.device))
        pre = self.view["pretrain"]
        for experiment, exp in self.pretrain.items():
            out.append(Job("pretrain", experiment, {
                "stage": "pretrain", "sweep": self.sweep, "device": self.device, "experiment": experiment,
                "runs": [spec.to_dict() for spec in exp.runs], "train": exp.train, "time_limit_s": pre["time_limit_s"],
                "compile_fallback": pre["compile_fallback"], "threads": pre["threads"],
                "concurrent_runs": pre["experiments"][experiment].get("concurrent_runs", 1)}))
        out += self.triton_jobs()
        out += self.context_parallel
        return out

    def triton_precompile_groups(self) -> list[str]:
        """Microbench groups that time our Triton kernels on a GPU: their jobs wait for the precompilation."""
        from attnbench.compiler.report import TRITON_BACKENDS

        if self.device != "cuda":
            return []
        return [g.name for g in self.microbench.values() if set(g.backends) & set(TRITON_BACKENDS)]

    def triton_jobs(self) -> list[Job]:
        """``precompile/triton``: every config the timed triton cases need, compiled in parallel first (GPU
        only); ``triton/compiler``: the compiler report on the triton stage's groups."""
        jobs = []
        # the precompilation serves the microbench stage (plan/precompile/triton.json), the report the triton stage
        for stage, name, groups in (("precompile", "triton", [self.microbench[g] for g in self.triton_precompile_groups()]),
                                    ("triton", "compiler", list(self.triton.values()))):
            if groups:
                cases = list(dict.fromkeys(c for g in groups for c in g.cases))
                backends = list(dict.fromkeys(b for g in groups for b in g.backends))
                kind = "precompile" if stage == "precompile" else name
                jobs.append(Job(stage, name, {"stage": f"triton-{kind}", "sweep": self.sweep, "device": self.device,
                                              "seed": self.view["seed"], "cases": [c.fields() for c in cases],
                                              "backends": backends}))
        return jobs

    def job(self, stage: str, name: str) -> Job:
        """One planned job by stage and name (command-line use); one-line error naming the planned ones."""
        jobs = {j.name: j for j in self.jobs() if j.stage == stage}
        if name not in jobs:
            raise ConfigError(f"{stage} job {name!r} is not planned for sweep {self.sweep!r} on {self.device}; "
                              f"allowed: {', '.join(jobs) or 'none'}")
        return jobs[name]

    def write_jobs(self, plan_dir: str | Path) -> list[Path]:
        """Write each job's file, rewriting only files whose content changed (so that an unchanged job's
        input keeps its modification time and Snakemake does not rerun it)."""
        paths = []
        for job in self.jobs():
            paths.append(write_if_changed(job.path(plan_dir), json.dumps(job.payload, indent=1, sort_keys=True)))
        write_if_changed(Path(plan_dir) / "config.json", json.dumps(self.config, indent=1, sort_keys=True))
        return paths

    def summary(self, benchmarks: str | Path | None = None) -> str:
        """The start line: the grid and why, the planned jobs per stage, and, when earlier runs of this
        sweep left Snakemake benchmark files (``benchmarks/<stage>/<name>.tsv``), the time they took."""
        jobs = self.jobs()
        counts = {}
        for job in jobs:
            counts[job.stage] = counts.get(job.stage, 0) + 1
        cases = sum(len(g.cases) for g in self.microbench.values())
        stages = ", ".join(f"{stage} {n}" for stage, n in counts.items()) or "none"
        line = (f"attnbench: sweep {self.sweep!r} runs the {self.device} grid ({self.why}); stages "
                f"{', '.join(self.stages) or 'none'}; {cases} microbench cases in {len(self.microbench)} groups; "
                f"jobs per stage: {stages}")
        if benchmarks is not None:
            seconds = [s for s in (earlier_seconds(Path(benchmarks) / job.stage / f"{job.name}.tsv") for job in jobs)
                       if s is not None]
            if seconds:
                line += (f"; {len(seconds)} of {len(jobs)} jobs took {sum(seconds) / 60:.1f} min together when this "
                         "sweep last ran them")
        return line


def earlier_seconds(benchmark: Path) -> float | None:
    """Wall seconds of a job's last run from its Snakemake ``benchmark:`` file (column ``s``), if it has one."""
    try:
        header, *rows = benchmark.read_text().splitlines()
        return float(rows[-1].split("\t")[header.split("\t").index("s")])
    except (OSError, ValueError, IndexError):
        return None


HBM_JOB_KEYS = ("ncu", "read_metric", "write_metric", "extra_metrics", "clock_control", "cache_control",
                "nvtx_include", "warmup_calls", "timeout_s", "time")


def write_if_changed(path: Path, text: str) -> Path:
    path = Path(path)
    if not (path.is_file() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _plan_device(config: dict, device: str, why: str, rule_backend_files: list[str] | None) -> Plan:
    """Check every section as ``device`` sees it; keep the jobs of the stages the sweep runs."""
    from attnbench.context.experiment import check_capability
    from attnbench.parallel.plan import context_parallel_jobs
    from attnbench.train.experiments import plan_experiments

    view = device_view(config, device)
    max_cases = config["max_cases"]
    plan = Plan(config={**config, "device": device}, view=view, why=why)
    groups = grid_groups(view["microbench"], f"microbench.{device}", max_cases)
    rule_backends = _rule_backends(view["microbench"], groups, f"microbench.{device}.rule_backends",
                                   rule_backend_files)
    _unique_pairs(groups, rule_backends, f"microbench.{device}.groups")
    stability = _named_groups(view["stability"]["groups"], groups)
    triton = _named_groups(view["triton"]["groups"], groups)
    hbm = grid_groups(view["hbm"], "hbm", max_cases)
    cost = grid_groups(view["context"]["cost"], f"context.cost.{device}", max_cases)
    capability = check_capability(view["context"]["capability"], "context.capability")
    pretrain = plan_experiments(view["pretrain"])
    plan.planned_runs = [spec.name for experiment in pretrain.values() for spec in experiment.runs]
    context_parallel = context_parallel_jobs(view["context_parallel"], view)
    stages = plan.stages
    if "microbench" in stages:
        plan.microbench, plan.rule_backends = groups, rule_backends
    if "stability" in stages:
        plan.stability = stability
    if "hbm" in stages:
        plan.hbm = hbm
    if "context" in stages:
        plan.context_cost, plan.capability = cost, capability
    if "pretrain" in stages:
        plan.pretrain = pretrain
    if "triton" in stages:
        plan.triton = triton
    if "context_parallel" in stages:
        plan.context_parallel = context_parallel
    return plan


def _rule_backends(section: dict, groups: dict[str, Group], where: str,
                   rule_backend_files: list[str] | None) -> dict[str, list[str]]:
    """Backends added as Snakemake rules: a rule file each (when the files are known), groups of this plan."""
    rule_backends = {k: list(v) for k, v in section.get("rule_backends", {}).items()}
    clash = sorted(set(rule_backends) & set(backend_names()))
    if clash:
        raise ConfigError(f"{where}: {clash[0]!r} is a Python adapter's name; allowed: a name no adapter uses")
    for name, names in rule_backends.items():
        if rule_backend_files is not None and name not in rule_backend_files:
            raise ConfigError(f"{where}: {name!r} has no rule file workflow/rules/backends/{name}.smk; "
                              f"allowed: {', '.join(sorted(rule_backend_files)) or 'none'}")
        for group in names:
            if group not in groups:
                raise ConfigError(f"{where}.{name}: group={group!r} is not in this plan's groups; "
                                  f"allowed: {', '.join(groups)}")
            if not all(case.dense for case in groups[group].cases):
                raise ConfigError(f"{where}.{name}: group {group!r} has ragged or variant cases; allowed: dense "
                                  "groups (a rule backend reads the cases TSV, which has no per-sequence lengths)")
    return rule_backends


def _named_groups(names: list[str], groups: dict[str, Group]) -> dict[str, Group]:
    """Microbench groups a later stage runs again (stability) or reports on (triton), by name: those of this
    device's grid (:func:`check_config` checks that each name is in some device's grid)."""
    return {name: groups[name] for name in names if name in groups}


def check_baseline(value) -> str | None:
    """``baseline``: a relative path under results/ (a committed reference, or another sweep's folder)."""
    if value is None:
        return None
    parts = Path(value).parts
    if Path(value).is_absolute() or not parts or parts[0] != "results" or ".." in parts:
        raise ConfigError(f"baseline={value!r} is not allowed; allowed: a relative path under results/ without '..' "
                          "(e.g. results/reference/cpu/cpu-a/microbench.parquet)")
    return value


def baseline_input(config: dict):
    """The compare rule's baseline input: the configured path, or (without one) an input function that
    stops that rule alone with a one-line error, so a sweep without a baseline runs every other target."""
    if config.get("baseline"):
        return config["baseline"]

    def missing(wildcards):
        raise ConfigError("compare: no baseline; set one with --config baseline=<results file or sweep folder "
                          "under results/> (e.g. results/reference/cpu/cpu-a/microbench.parquet)")
    return missing


def check_config(config: dict, rule_backend_files: list[str] | None = None) -> dict[str, Plan]:
    """Plan every device, so that a CPU host checks the ``cuda`` blocks too; one-line ConfigError on any problem."""
    from attnbench.train.experiments import check_selected_runs

    check_baseline(config.get("baseline"))
    plans = {device: _plan_device(config, device, f"planned for {device}", rule_backend_files) for device in DEVICES}
    check_selected_runs(config["pretrain"]["select"]["runs"],
                        list(dict.fromkeys(name for plan in plans.values() for name in plan.planned_runs)))
    for section in ("stability", "triton"):
        known = {g for device in DEVICES for g in config["microbench"][device]["groups"]}
        for name in config[section]["groups"]:
            if name not in known:
                raise ConfigError(f"{section}.groups: {name!r} is not a group of microbench.cpu or microbench.cuda; "
                                  f"allowed: {', '.join(sorted(known))}")
    return plans


def build_plan(config: dict, device: str | None = None, rule_backend_files: list[str] | None = None) -> Plan:
    """The plan of the device that runs (``device`` given, or resolved from ``config['device']``),
    after checking every device's plan."""
    plans = check_config(config, rule_backend_files)
    if device is None:
        device, why = resolve_device(config)
    else:
        why = f"planned for {device}"
    plan = plans[device]
    plan.why = why
    check_data_files(plan)
    return plan


def check_data_files(plan: Plan) -> None:
    """The files this host's jobs will read, checked now: every planned run's training text and the context
    experiment's. Only the device that runs: a GPU sweep's data paths are the GPU host's, not the laptop's."""
    from attnbench.train.data import DataConfig, check_source

    merged = " (with its cuda block merged)" if plan.device == "cuda" else ""
    for data in {spec.data for experiment in plan.pretrain.values() for spec in experiment.runs}:
        check_source(data, f"pretrain.data{merged}")
    if plan.capability is not None:
        check_source(DataConfig.from_dict(plan.capability["data"]), f"context.capability.data{merged}")


def load_plan(config_path: str | Path, device: str | None = None) -> Plan:
    """A config file's plan (command-line use without the workflow)."""
    from attnbench.config import load_config

    return build_plan(load_config(config_path), device)


def read_job(path: str | Path, stages: tuple[str, ...]) -> dict:
    """A job's plan file (:meth:`Plan.write_jobs`); one line naming the file for anything else."""
    try:
        payload = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"job file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not a job file ({type(err).__name__}: {' '.join(str(err).split())[:120]})") from None
    if not isinstance(payload, dict) or payload.get("stage") not in stages:
        found = payload.get("stage") if isinstance(payload, dict) else type(payload).__name__
        raise ConfigError(f"{path}: stage={found!r} is not allowed here; allowed: {', '.join(stages)}")
    return payload


def job_cases(payload: dict) -> list[Case]:
    """The cases of a results job, checked again as they are built."""
    try:
        return [Case(**fields) for fields in payload["cases"]]
    except (TypeError, KeyError, CaseError) as err:
        raise ConfigError(f"job {payload.get('stage')}/{payload.get('group')}: a case is not valid ({err})") from None


RESULTS_STAGES = ("microbench", "microbench-rule", "stability", "hbm", "context-cost")


def resolve_job(*, job: str | None, config: str | None, stage: str, name: str | None,
                stages: tuple[str, ...]) -> dict:
    """A command's job: its plan file (``--job``, what the workflow passes), or planned now from a config
    file (``--config`` with the job's name, for use without the workflow)."""
    if job:
        return read_job(job, stages)
    if not (config and name):
        raise ConfigError(f"give --job (a plan file), or --config with the {stage} job's name")
    return load_plan(config).job(stage, name).payload
