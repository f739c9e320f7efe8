"""Request streams: the shipped traces (pinned), a user's CSV, seeded distributions; one-line errors."""
import numpy as np
import pytest

from attnbench.workloads import requests
from attnbench.workloads.requests import RequestsError, csv_trace, shipped_trace, synthetic, trace


@pytest.mark.parametrize("name, n, longest", [("azure-code", 8819, 7437), ("azure-conv", 19366, 14050)])
def test_shipped_traces_load_with_their_pinned_hashes(name, n, longest):
    r = shipped_trace(name)
    assert r.name == name and len(r) == n and len(r.generated) == n  # the counts of the data README
    assert r.context.max() == longest and r.context.min() >= 1 and (r.generated >= 0).all()
    assert r.context.dtype == np.int64


def test_a_changed_shipped_file_is_an_error_not_a_drift(monkeypatch):
    shipped_trace.cache_clear()
    monkeypatch.setitem(requests.SHIPPED, "azure-code", (requests.SHIPPED["azure-code"][0], "0" * 64))
    try:
        with pytest.raises(RequestsError, match="SHA-256 .* does not match the pinned 0000"):
            shipped_trace("azure-code")
    finally:
        shipped_trace.cache_clear()


def test_a_csv_trace_is_named_by_its_stem_and_sorted_by_arrival(tmp_path):
    path = tmp_path / "mytrace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:02,30,4\n2023-01-01 00:00:01,10,2\n")
    r = trace(str(path))
    assert r.name == "mytrace" and r.context.tolist() == [10, 30] and r.generated.tolist() == [2, 4]
    (tmp_path / "plain.csv").write_text("ContextTokens\n5\n7\n")  # no output lengths: 0
    assert csv_trace(str(tmp_path / "plain.csv")).generated.tolist() == [0, 0]


@pytest.mark.parametrize("name, text, pattern", [
    ("t.txt", "ContextTokens\n5\n", r"allowed: azure-code, azure-conv, or a path ending in \.csv"),
    ("nocol.csv", "Tokens\n5\n", r"no ContextTokens column"),
    ("zero.csv", "ContextTokens\n0\n", r"positive integer in every row"),
    ("azure-conv.csv", "ContextTokens\n5\n", r"cannot name a workload"),
])
def test_bad_trace_files_are_one_line_errors(tmp_path, name, text, pattern):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(RequestsError, match=pattern) as info:
        trace(str(path))
    assert "\n" not in str(info.value)


def test_a_missing_trace_file_is_named():
    with pytest.raises(RequestsError, match=r"trace='nowhere/x\.csv': no such file"):
        trace("nowhere/x.csv")


def test_synthetic_streams_are_seeded_and_bounded():
    a = synthetic("lognormal", 500, seed=3, median_len=200, sigma=1.0, min_len=8, max_len=1000)
    b = synthetic("lognormal", 500, seed=3, median_len=200, sigma=1.0, min_len=8, max_len=1000)
    assert np.array_equal(a.context, b.context) and a.name == "lognormal"
    assert a.context.min() >= 8 and a.context.max() <= 1000 and 100 < np.median(a.context) < 400
    u = synthetic("uniform", 500, seed=0, min_len=3, max_len=9)
    assert set(u.context.tolist()) == set(range(3, 10))  # both ends included
    assert synthetic("fixed", 4, seed=0, length=64).context.tolist() == [64] * 4
    assert not np.array_equal(a.context, synthetic("lognormal", 500, seed=4, median_len=200, sigma=1.0).context)
