"""Shared pieces of the attack catalogue (docs/security.md): a tiny sweep, a ceilings file, and the
assertions every attack ends in: a one-line error, a refused effect, or the data kept."""
import json
from pathlib import Path

import pytest
import yaml

from attnbench import config as configs
from attnbench import plan as planner
from attnbench.cli import main
from attnbench.errors import ConfigError
from tests.helpers import with_key

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = [p.stem for p in (REPO / "workflow" / "rules" / "backends").glob("*.smk")]
CONFIG = {
    "sweep": "sec",
    "device": "cpu",
    "stages": ["microbench"],
    "numerics": False,
    "timing": {"cpu_min_run_time_s": 0.01},
    "microbench": {
        "cpu": {"backends": ["eager", "sdpa-math"],
                "groups": {"g": {"mode": "fwd", "heads_q": 2, "head_dim": 16, "seq": [32, 48], "dtype": "fp32"}}},
        "cuda": {"backends": ["sdpa-flash"], "groups": {"g": {"seq": 64}}},
    },
}
CEILINGS = {"device": "cpu", "device_name": "test CPU", "copy_bytes_per_s": 1e10,
            "matmul_flops_per_s": {"fp32": 1e11, "fp16": 1e10, "bf16": 1e10}, "measured_at": "2026-01-01T00:00:00Z"}


def with_(path: str, value, base=CONFIG) -> dict:
    """``base`` (the tiny sweep by default) with the dotted key ``path`` set to ``value``."""
    return with_key(base, path, value)


def plan_of(config: dict):
    return planner.build_plan(configs.validate_config(config), rule_backend_files=RULE_FILES)


def refused(config: dict, *fragments: str) -> str:
    """The config is refused at planning time with one line holding every fragment; returns the line."""
    with pytest.raises(ConfigError) as err:
        plan_of(config)
    message = str(err.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def cli_error(args: list[str], capsys, *fragments: str) -> str:
    """``attnbench <args>`` exits 2 and its last stderr line is the error, holding every fragment (no traceback)."""
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    last = err.splitlines()[-1]
    assert last.startswith("attnbench: error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in last, last
    return last


def usage_error(args: list[str], capsys, *fragments: str) -> str:
    """An argparse refusal: exit status 2 and exactly one stderr line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture
def ceilings_file(tmp_path):
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps(CEILINGS))
    return path
