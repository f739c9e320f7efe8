"""The README's backend plugin, taken literally: it registers through an entry point and runs MHA and GQA cases."""
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pandas as pd

from attnbench import config as configs
from attnbench import plan as planner
from attnbench.cli import main
from attnbench.kernels import registry

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_plugin_runs_as_written(tmp_path, monkeypatch):
    readme = (REPO / "README.md").read_text()
    code = re.search(r"<!-- plugin-example -->\n```python\n(.*?)```\n<!-- /plugin-example -->", readme, re.S).group(1)
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "my_attention.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = re.search(r'\[project.entry-points."attnbench.backends"\]\nmine = "(.+?)"', readme).group(1)
    ep = md.EntryPoint(name="mine", value=entry, group=registry.ENTRY_POINT_GROUP)
    real = md.entry_points
    monkeypatch.setattr(md, "entry_points", lambda **kw: [ep] if kw.get("group") == registry.ENTRY_POINT_GROUP
                        else real(**kw))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry._discover.cache_clear()
    try:
        config = configs.validate_config({
            "sweep": "plugin", "device": "cpu", "stages": ["microbench"], "timing": {"cpu_min_run_time_s": 0.01},
            "microbench": {d: {"backends": ["mine", "eager"], "groups": {"g": {
                "mode": ["fwd", "fwd_bwd"], "layout": ["mha", "gqa"], "heads_q": 4, "gqa_group": 2, "head_dim": 16,
                "seq": 32, "causal": [False, True]}}} for d in ("cpu", "cuda")}})
        planner.build_plan(config).write_jobs(tmp_path / "plan")
        out = tmp_path / "rows.parquet"
        assert main(["microbench", "--job", str(tmp_path / "plan" / "microbench" / "g.json"), "--out", str(out)]) == 0
        rows = pd.read_parquet(out)
        mine = rows[rows["backend"] == "mine"]
        assert len(mine) == 8 and set(mine["status"]) == {"ok"}, mine[["layout", "mode", "status", "reason"]]
        assert set(mine["layout"]) == {"mha", "gqa"}
    finally:
        registry._discover.cache_clear()
        sys.modules.pop("my_package.my_attention", None)
        sys.modules.pop("my_package", None)
