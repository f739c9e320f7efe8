"""attnbench wheelhouse: requirement sets, target platforms, what is kept, and the two pip calls (no network)."""
import json
import sys
from pathlib import Path

import pytest

from attnbench import wheelhouse
from attnbench.cli import main
from attnbench.wheelhouse import Target, WheelhouseError, build_wheelhouse, keep, read_have, requirements


def test_sets_expand_with_the_cuda_extra():
    assert requirements(["fa4", "flashinfer"]) == ["flash-attn-4[cu13]>=4.0.0b36", "flashinfer-python"]
    assert requirements(["fa4"], cuda=12) == ["flash-attn-4>=4.0.0b36"]
    assert requirements([], ["flashinfer-python==0.7.4"]) == ["flashinfer-python==0.7.4"]
    with pytest.raises(WheelhouseError, match=r"set='fa9' is not known; allowed: fa4, flashinfer"):
        requirements(["fa9"])
    with pytest.raises(WheelhouseError, match="nothing to download"):
        requirements([])


def test_target_lists_every_manylinux_tag_the_host_accepts():
    tags = Target(glibc="2.28").platforms()
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux_2_29_x86_64" not in tags
    assert tags[-2:] == ["manylinux2014_x86_64", "linux_x86_64"]
    args = Target(python="3.12").pip_target_args()
    assert args[:5] == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12"]
    with pytest.raises(WheelhouseError, match="glibc='2.5'"):
        Target(glibc="2.5").platforms()


@pytest.mark.parametrize("name, kept", [
    ("torch", False), ("triton", False), ("nvidia-cudnn-cu13", False), ("nvidia_cublas", False),
    ("nvidia-cutlass-dsl-libs-cu13", True), ("nvidia-cutlass-dsl-libs-cu12", False), ("nvidia-cutlass-dsl", True),
    ("nvidia-cudnn-frontend", True), ("apache-tvm-ffi", True), ("numpy", False), ("Jinja2", True),
])
def test_keep_drops_what_the_host_has(name, kept):
    assert keep(name, Target(cuda=13), have={"numpy"}) is kept


def test_have_file_names_are_normalised(tmp_path):
    path = tmp_path / "have.txt"
    path.write_text("# host image\nNumPy==2.1\ncuda_bindings\n\npyyaml>=6 ; python_version>'3'\n")
    assert read_have(str(path)) == {"numpy", "cuda-bindings", "pyyaml"}


def test_build_resolves_then_downloads_only_what_is_missing(tmp_path):
    calls = []

    def fake_pip(cmd, check, env):
        calls.append(cmd)
        if "--report" in cmd:
            report = cmd[cmd.index("--report") + 1]
            Path(report).write_text(json.dumps({"install": [
                {"metadata": {"name": n, "version": v}} for n, v in
                [("flash-attn-4", "4.0.0b36"), ("torch", "2.9.1"), ("nvidia-cutlass-dsl", "4.8.1"),
                 ("nvidia-cublas-cu12", "12.8"), ("einops", "0.8.2")]]}))

    pins = build_wheelhouse(["fa4"], str(tmp_path / "wh"), have={"einops"}, run=fake_pip)
    assert pins == ["flash-attn-4==4.0.0b36", "nvidia-cutlass-dsl==4.8.1"]
    resolve, download = calls
    assert resolve[:5] == [sys.executable, "-m", "pip", "install", "--dry-run"] and "--target" in resolve
    assert resolve[-1] == "flash-attn-4[cu13]>=4.0.0b36"
    assert download[3:5] == ["download", "--no-deps"] and download[-2:] == pins
    text = (tmp_path / "wh" / "requirements.txt").read_text()
    assert "pip install --no-index --find-links" in text and text.strip().endswith("nvidia-cutlass-dsl==4.8.1")


def test_cli_bad_set_is_a_one_line_error(capsys, tmp_path):
    with pytest.raises(SystemExit):  # argparse rejects it before any pip call
        main(["wheelhouse", "--sets", "fa9", "--out", str(tmp_path)])
    assert "invalid choice: 'fa9'" in capsys.readouterr().err


def test_cli_pip_failure_is_reported(monkeypatch, capsys, tmp_path):
    import subprocess

    def failing(cmd, check, env):
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(wheelhouse.subprocess, "run", failing)
    assert main(["wheelhouse", "--sets", "fa4", "--out", str(tmp_path / "wh")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: error: pip exited with 1 (install --dry-run)") and "\n" not in err
