"""Nsight Compute command lines and raw-page CSV parsing.

The CSV texts below are FORMAT FIXTURES written by hand after ncu's documented
``--csv --page raw`` layout (a header row, a units row, one row per kernel,
``==PROF==`` lines around them, thousands separators in numbers); they are not
measurements, and no number here is a result.
"""
import pytest

from attnbench.hbm import ncu

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"')
UNITS = '"","","","","","","","","","","","byte","byte","nsecond"'


def kernel_line(i, name, read, write, ns):
    return (f'"{i}","4242","python3","gpu-host","{name}","1","7","(128, 1, 1)","(64, 16, 4)","0","9.0",'
            f'"{read}","{write}","{ns}"')


A, B = "0123456789ab", "ba9876543210"
KERNELS = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3)",
    HEADER, UNITS,
    kernel_line(0, "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
                "242,123,456", "73,000,000", "1,250,000"),
    kernel_line(1, "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "1,000,000", "2,000,000", "10,000"),
    kernel_line(2, "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*, const float*, int)",
                "4,000,000", "4,000,000", "20,000"),
    kernel_line(3, "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", "3,000,000", "500,000", "15,000"),
    "==PROF== Disconnected from process 4242",
])
# the same report printed with --print-nvtx-rename kernel: each kernel named after its innermost push/pop range;
# kernel 2 ran inside a range some library pushed within ours
RENAMED = "\n".join([
    HEADER, UNITS,
    kernel_line(0, f"attnbench-hbm:{A}:sdpa-flash", "242,123,456", "73,000,000", "1,250,000"),
    kernel_line(1, f"attnbench-hbm:{B}:eager", "1,000,000", "2,000,000", "10,000"),
    kernel_line(2, "softmax_inner_range", "4,000,000", "4,000,000", "20,000"),
    kernel_line(3, f"attnbench-hbm:{B}:eager", "3,000,000", "500,000", "15,000"),
])
METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"]


def test_parse_raw_csv_reads_rows_in_base_units():
    rows = ncu.parse_raw_csv(KERNELS, METRICS)
    assert [r.id for r in rows] == [0, 1, 2, 3]
    assert rows[0].name.startswith("void pytorch_flash::flash_fwd_kernel")
    assert rows[0].values["dram__bytes_read.sum"] == 242_123_456
    assert rows[0].values["dram__bytes_write.sum"] == 73_000_000
    assert rows[0].values["gpu__time_duration.sum"] == pytest.approx(1.25e-3)  # nsecond -> second
    assert rows[0].units == {"dram__bytes_read.sum": "byte", "dram__bytes_write.sum": "byte",
                             "gpu__time_duration.sum": "second"}


def test_scaled_units_and_missing_values():
    text = "\n".join([HEADER, UNITS.replace('"byte","byte","nsecond"', '"Mbyte","Kbyte","usecond"'),
                      kernel_line(0, "k", "1.5", "n/a", "2")])
    (row,) = ncu.parse_raw_csv(text, METRICS)
    assert row.values["dram__bytes_read.sum"] == 1.5e6
    assert row.values["dram__bytes_write.sum"] != row.values["dram__bytes_write.sum"]  # NaN: unknown, not zero
    assert row.values["gpu__time_duration.sum"] == pytest.approx(2e-6)


def test_parse_errors_are_one_line():
    with pytest.raises(ncu.NcuParseError, match="no raw-page CSV header"):
        ncu.parse_raw_csv("==ERROR== the application returned an error code (1)\n")
    with pytest.raises(ncu.NcuParseError, match="metric 'lts__t_bytes.sum' is not in the ncu CSV"):
        ncu.parse_raw_csv(KERNELS, ["lts__t_bytes.sum"])


def test_attribute_sums_every_kernel_of_a_range():
    totals = ncu.attribute(ncu.parse_raw_csv(KERNELS, METRICS), ncu.parse_raw_csv(RENAMED, []))
    assert set(totals) == {(A, "sdpa-flash"), (B, "eager")}
    flash, eager = totals[(A, "sdpa-flash")], totals[(B, "eager")]
    assert flash.values["dram__bytes_read.sum"] == 242_123_456 and flash.n_kernels == 1 and flash.by_order == 0
    # kernels 1, 2 (by launch order: its own range was an inner one) and 3
    assert eager.values["dram__bytes_read.sum"] == 1_000_000 + 4_000_000 + 3_000_000
    assert eager.values["dram__bytes_write.sum"] == 2_000_000 + 4_000_000 + 500_000
    assert eager.n_kernels == 3 and eager.by_order == 1
    assert eager.kernels[1].startswith("void at::native")  # real names, not range names


def test_a_kernel_before_any_tag_is_an_error():
    renamed = RENAMED.replace(f"attnbench-hbm:{A}:sdpa-flash", "somewhere_else")
    with pytest.raises(ncu.NcuParseError, match="outside every attnbench-hbm"):
        ncu.attribute(ncu.parse_raw_csv(KERNELS, METRICS), ncu.parse_raw_csv(renamed, []))


def test_profile_command_profiles_only_the_tagged_calls(tmp_path):
    settings = ncu.NcuSettings(extra_metrics=("gpu__time_duration.sum", "dram__bytes_read.sum"))
    cmd = ncu.profile_command(settings, "/opt/ncu", tmp_path / "r", tmp_path / "log", ["python3", "-m", "app"])
    text = " ".join(cmd)
    for flag in ("--profile-from-start off", "--nvtx --nvtx-include attnbench-hbm/", "--clock-control none",
                 "--cache-control all", "--target-processes application-only", "--force-overwrite"):
        assert flag in text
    assert cmd[cmd.index("--metrics") + 1] == "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"
    assert cmd[-3:] == ["python3", "-m", "app"]
    bare = ncu.profile_command(ncu.NcuSettings(nvtx_include=""), "ncu", tmp_path / "r", tmp_path / "log", ["app"])
    assert "--nvtx-include" not in bare and "--nvtx" in bare  # --nvtx stays: the rename needs the ranges
    imported = ncu.import_command("/opt/ncu", tmp_path / "r.ncu-rep", rename=True)
    assert imported[-2:] == ["--print-nvtx-rename", "kernel"] and "--print-units" in imported
    assert ncu.range_tag(A, "flex") == f"attnbench-hbm:{A}:flex"
    assert ncu.TAG_RE.search(f"<default domain>:attnbench-hbm:{A}:sdpa-flash").groups() == (A, "sdpa-flash")


def test_log_problems_and_missing_ncu():
    reason = ncu.permission_problem("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
                                    "NVIDIA GPU Performance Counters on the target device 0.")
    assert "ERR_NVGPUCTRPERM" in reason
    assert ncu.permission_problem("==PROF== Connected to process 1\n==PROF== Disconnected") is None
    assert ncu.error_lines("==PROF== x\n==ERROR== Failed to profile kernel\n==ERROR== again") == \
        "==ERROR== Failed to profile kernel | ==ERROR== again"
    assert ncu.find_ncu("ncu-that-does-not-exist") == (None, "ncu-that-does-not-exist not found on PATH "
                                                             "(install Nsight Compute or set hbm.ncu)")
