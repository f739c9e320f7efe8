"""The W&B Report's spec (written offline, no key, no network) and the wandb-workspaces Report built from it."""
import pytest

from attnbench.report.stages import SECTIONS
from attnbench.report.wandb_report import build_report, read_spec, report_spec, save_spec

INDEXES = {
    "env": {"tables": [{"name": "ceilings", "group": "env"}], "figures": []},
    "microbench": {"tables": [{"name": "tflops", "group": "microbench"}, {"name": "fa3_fwd", "group": "backends"},
                              {"name": "triton_vs_best", "group": "triton"}],
                   "figures": [{"name": "roofline", "group": "microbench"}]},
    "pretrain": {"tables": [{"name": "fp8", "group": "fp8"}], "figures": [{"name": "fp8", "group": "fp8"}]},
}
CAPTIONS = {"env/ceilings": "Ceilings.", "microbench/tflops": "TFLOP/s <b>|</b>.", "microbench/fa3_fwd": "FA3.",
            "microbench/triton_vs_best": "Ours.", "microbench/figures/roofline": "Roofline.", "pretrain/fp8": "FP8.",
            "pretrain/figures/fp8": "FP8 loss.", "microbench/results": "Rows."}


@pytest.fixture
def spec(tmp_path):
    spec = report_spec(INDEXES, CAPTIONS, project="p", entity=None, sweep="s", run_name="s-abc")
    return read_spec(save_spec(spec, tmp_path / "report-spec.json"))


def test_spec_has_the_report_sections_in_order_with_their_keys(spec):
    order = [s.name for s in SECTIONS]
    names = [s["name"] for s in spec["sections"]]
    assert names == sorted(names, key=order.index) == ["env", "microbench", "backends", "triton", "pretrain"]
    by_name = {s["name"]: s for s in spec["sections"]}
    assert [e["key"] for e in by_name["microbench"]["tables"]] == ["microbench/tflops", "microbench/results"]
    assert [e["key"] for e in by_name["backends"]["tables"]] == ["microbench/fa3_fwd"]
    assert [e["key"] for e in by_name["pretrain"]["figures"]] == ["pretrain/figures/fp8"]
    assert spec["runset"] == {"name": "s", "query": "s-abc"} and spec["entity"] is None


def test_report_is_built_from_the_spec_without_saving(spec):
    pytest.importorskip("wandb_workspaces")
    import wandb_workspaces.reports.v2 as wr

    report = build_report(spec, entity="someone")
    headings = [b.text for b in report.blocks if isinstance(b, wr.H2)]
    assert headings == [s["title"] for s in spec["sections"]]
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    tables = [p.table_name for g in grids for p in g.panels if isinstance(p, wr.WeavePanelSummaryTable)]
    assert tables == [e["key"] for s in spec["sections"] for e in s["tables"]]
    media = [k for g in grids for p in g.panels if isinstance(p, wr.MediaBrowser) for k in p.media_keys]
    assert media == ["microbench/figures/roofline", "pretrain/figures/fp8"]
    text = " ".join(b.text for b in report.blocks if isinstance(b, wr.MarkdownBlock))
    assert "<b>" not in text and "&lt;b&gt;" in text  # captions escaped
    assert report.entity == "someone" and all(r.entity == "someone" for g in grids for r in g.runsets)
