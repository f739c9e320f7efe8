"""What the committed long-FP8 reference folders (results/reference/<gpu>/fp8-long, fp8-stream) are checked with:
their pretraining stage written anew from their rows, its tables against the committed ones, and the runs a later
lease would put back from them."""
import shutil
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
FP8_TABLES = ["fp8.csv", "fp8_contrasts.csv", "fp8_layers.csv", "fp8_scales.csv", "fp8_seeds.csv", "fp8_spikes.csv"]


def rebuild(sweep: Path, folder: Path) -> Path:
    """``sweep``'s FP8 rows in ``folder``, a sweep folder of their own, with the pretraining stage's outputs written
    anew."""
    from attnbench.report import stages

    shutil.copytree(sweep / "pretrain" / "fp8", folder / "pretrain" / "fp8")
    stages.write("pretrain", folder, ("fp8",))
    return folder


def assert_committed_tables_equal(sweep: Path, rebuilt: Path) -> None:
    committed = sorted((sweep / "pretrain" / "tables").glob("*.csv"))
    assert [p.name for p in committed] == FP8_TABLES
    for path in committed:
        pd.testing.assert_frame_equal(pd.read_csv(rebuilt / "pretrain" / "tables" / path.name), pd.read_csv(path),
                                      obj=str(path.relative_to(sweep)))


def planned_and_restored(sweep_file: str, sweep: Path, tmp_path: Path) -> tuple[list[str], list[str]]:
    """The FP8 runs ``config/sweeps/<sweep_file>`` plans today, and those `attnbench experiment restore` puts back
    from ``sweep``'s rows into ``tmp_path`` (run from the repository root: the rows' path is relative to it)."""
    from attnbench.plan import load_plan
    from attnbench.train.loop import RunSpec
    from attnbench.train.restore import restore_finished_runs

    plan = load_plan(REPO / "config" / "sweeps" / sweep_file, "cuda")
    specs = [RunSpec.from_dict(d) for d in plan.job("pretrain", "fp8").payload["runs"]]
    restored = restore_finished_runs("fp8", specs, (sweep / "pretrain" / "fp8").relative_to(REPO), tmp_path)
    return [s.name for s in specs], restored
