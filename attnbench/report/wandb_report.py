"""The W&B Report of a published sweep, through wandb-workspaces (``wandb_workspaces.reports.v2``).

The report has the executed report's sections (:data:`attnbench.report.stages.SECTIONS`), each a
heading, its tables' and figures' captions, and a panel grid over the sweep's run with one summary
table panel per logged table and a media browser for its figures.

It is built from a **spec**, plain JSON that :func:`report_spec` makes at publish time::

    {"format": 1, "title": ..., "description": ..., "project": ..., "entity": ... | null,
     "runset": {"name": <sweep>, "query": <run name>},
     "sections": [{"name": "hbm", "title": "HBM traffic ...",
                   "tables": [{"key": "hbm/bytes", "caption": ...}],
                   "figures": [{"key": "hbm/figures/roofline", "caption": ...}]}]}

Online, ``attnbench publish`` builds and saves it; offline, the spec lands in the run's files
(uploaded by ``wandb sync``) and ``attnbench wandb-report --spec <file>`` builds it later. Installing
``wandb-workspaces`` (the ``wandb`` extra) is needed only to build it, never to write the spec.
"""
from __future__ import annotations

import json
from pathlib import Path

from attnbench.report import escape
from attnbench.report.stages import SECTIONS

SPEC_FORMAT = 1


def _section_of(stage: str, group: str) -> str:
    """An entry belongs to the section named after its group (backends, triton), else its stage's."""
    names = {s.name for s in SECTIONS}
    return group if group in names else stage


def report_spec(indexes: dict[str, dict], captions: dict[str, str], *, project: str, entity: str | None,
                sweep: str, run_name: str) -> dict:
    sections = {s.name: {"name": s.name, "title": s.title, "tables": [], "figures": []} for s in SECTIONS}
    for stage, index in indexes.items():
        for kind, key_of in (("tables", lambda e: f"{stage}/{e['name']}"),
                             ("figures", lambda e: f"{stage}/figures/{e['name']}")):
            for entry in index[kind]:
                key = key_of(entry)
                sections[_section_of(stage, entry["group"])][kind].append({"key": key, "caption": captions[key]})
    if "microbench/results" in captions:
        sections["microbench"]["tables"].append({"key": "microbench/results",
                                                 "caption": captions["microbench/results"]})
    return {"format": SPEC_FORMAT, "title": f"attnbench sweep {sweep}"[:128],
            "description": f"Every stage of the attnbench sweep {sweep!r}, run {run_name}: the executed report's "
                           "sections with their tables and figures.",
            "project": project, "entity": entity, "runset": {"name": sweep, "query": run_name},
            "sections": [s for s in sections.values() if s["tables"] or s["figures"]]}


def save_spec(spec: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


def read_spec(path: str | Path) -> dict:
    spec = json.loads(Path(path).read_text())
    if not isinstance(spec, dict) or spec.get("format") != SPEC_FORMAT:
        raise ValueError(f"{path}: not a report spec of format {SPEC_FORMAT}")
    return spec


def build_report(spec: dict, entity: str | None = None):
    """The ``wandb_workspaces`` Report of a spec (nothing is sent until its ``save()``)."""
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError as err:
        raise RuntimeError("building the W&B Report needs wandb-workspaces: pip install 'attnbench[wandb]'") from err

    entity = entity or spec.get("entity")
    extra = {"entity": entity} if entity else {}  # else the API key's default entity
    runset = wr.Runset(project=spec["project"], name=spec["runset"]["name"], query=spec["runset"]["query"], **extra)
    blocks = [wr.TableOfContents()]
    for section in spec["sections"]:
        blocks.append(wr.H2(section["title"]))
        lines = [f"* {escape.code(e['key'])}: {escape.markdown(e['caption'])}"
                 for e in section["tables"] + section["figures"]]
        blocks.append(wr.MarkdownBlock("\n".join(lines)))
        panels = [wr.WeavePanelSummaryTable(table_name=e["key"], layout=wr.Layout(w=24, h=12))
                  for e in section["tables"]]
        if section["figures"]:
            panels.append(wr.MediaBrowser(title=section["title"], media_keys=[e["key"] for e in section["figures"]],
                                          num_columns=2, layout=wr.Layout(w=24, h=16)))
        blocks.append(wr.PanelGrid(runsets=[runset], panels=panels))
    return wr.Report(project=spec["project"], title=spec["title"], description=spec["description"], blocks=blocks,
                     **extra)


def save_report(spec_path: str | Path, entity: str | None = None) -> str:
    """Build the Report of a saved spec and save it to W&B (needs a key); its URL."""
    return build_report(read_spec(spec_path), entity).save().url
