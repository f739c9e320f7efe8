"""The results row: its columns, their types, and the atomic parquet writer.

One row per (case, backend). :data:`COLUMNS` is the single source of truth;
``attnbench schema results`` renders it as the JSON schema the workflow
validates against, and :func:`validate_rows` checks a frame against it.
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import pandas as pd

from attnbench.case import Case

STATUSES = ("ok", "unsupported", "unavailable", "oom", "error", "timeout", "numerics_fail")
MEASURED = ("ok", "numerics_fail")  # the statuses of rows that carry a time (numerics_fail was timed, then gated)
# ok: checked and within the gate; fail: outside it or non-finite (the row's status is numerics_fail);
# oom/error: the check itself could not run (the row keeps its timing status); off: numerics disabled;
# not_run: the row was not timed
NUMERICS_STATUSES = ("ok", "fail", "oom", "error", "off", "not_run")

# name: (type, description). Types: string, integer, number, boolean, array (of numbers).
COLUMNS: dict[str, tuple[str, str]] = {
    # identity
    "sweep": ("string", "sweep name from the config"),
    "group": ("string", "case group the row was run in"),
    "case_id": ("string", "stable hash of the case fields"),
    "backend": ("string", "registered backend name"),
    "backend_version": ("string", "version of the library behind the backend"),
    "mode": ("string", "fwd, fwd_bwd or decode"),
    "layout": ("string", "mha, gqa, mqa or mla"),
    "batch": ("integer", "batch size"),
    "heads_q": ("integer", "query heads"),
    "heads_kv": ("integer", "key/value heads"),
    "head_dim_qk": ("integer", "query/key head dim"),
    "head_dim_v": ("integer", "value head dim"),
    "seq_q": ("integer", "query length"),
    "seq_kv": ("integer", "key/value length"),
    "causal": ("boolean", "bottom-right aligned causal mask"),
    "dtype": ("string", "fp32, fp16, bf16 or fp8"),
    "page_size": ("integer", "KV page size, 0 for contiguous"),
    "workload": ("string", "where the lengths come from: fixed (the grid's), uniform, lognormal, azure-conv, azure-code "
                           "or a trace file's name (docs/workloads.md)"),
    "seq_lens_q": ("string", "query tokens per sequence of a ragged batch, comma-separated; empty: every one seq_q"),
    "seq_lens_kv": ("string", "KV tokens per sequence of a ragged batch, comma-separated; empty: every one seq_kv"),
    "variant": ("string", "none, sliding_window, softcap, alibi, document or prefix_lm"),
    "window": ("integer", "sliding_window: keys a query sees before its own position (0 otherwise)"),
    "softcap": ("number", "softcap: c in c * tanh(score / c) (0 otherwise)"),
    "doc_len": ("integer", "document: tokens per packed document (0 otherwise)"),
    "prefix_len": ("integer", "prefix_lm: leading tokens that attend bidirectionally (0 otherwise)"),
    # batch shape (batch = sequences; seq_q and seq_kv = the longest)
    "tokens_q": ("integer", "real query tokens of the batch (no padding)"),
    "tokens_kv": ("integer", "real KV tokens of the batch (no padding)"),
    "seq_q_median": ("number", "median query tokens per sequence"),
    "seq_kv_median": ("number", "median KV tokens per sequence"),
    "compute_dtype": ("string", "precision the backend computes in (differs from dtype for fp8 backends)"),
    # outcome
    "status": ("string", "one of " + ", ".join(STATUSES)),
    "reason": ("string", "why the status is not ok (empty when ok)"),
    # timing
    "timer": ("string", "do_bench, cuda_graph or torch.utils.benchmark"),
    "ms_median": ("number", "median time per call over every sample of every round, ms"),
    "ms_ci_low": ("number", "95% interval of ms_median, low end (two-level bootstrap over rounds and samples; "
                            "attnbench.bench.stats, docs/statistics.md)"),
    "ms_ci_high": ("number", "95% interval of ms_median, high end"),
    "ms_p20": ("number", "20th percentile of the samples, ms"),
    "ms_p80": ("number", "80th percentile of the samples, ms"),
    "cv": ("number", "coefficient of variation of the samples"),
    "n_reps": ("integer", "timed samples, all rounds together"),
    "n_rounds": ("integer", "rounds kept (timing.repeats; the backends of a case in rotating order within a round)"),
    "round_ms": ("array", "median of each kept round, ms, in round order: the pairs of attnbench.bench.stats.pairs"),
    "round_cv": ("number", "coefficient of variation of the round medians: the spread between rounds"),
    "n_discarded": ("integer", "rounds timed again because a throttle reason was active (timing.discard_throttled)"),
    "setup_s": ("number", "build() plus first call (layout conversion, planning, JIT/compile, autotune) wall time, s"),
    # derived
    "flops": ("number", "FLOPs of one call over the real tokens and the variant's unmasked pairs "
                        "(conventions.workload_flops; conventions.flops for a dense case)"),
    "flops_padded": ("number", "FLOPs of the batch padded to its longest sequence, no variant (conventions.flops): "
                               "1 - flops / flops_padded is the work padding would waste"),
    "tflops": ("number", "flops / median time / 1e12"),
    "bytes_min": ("number", "each input read once, each output written once"),
    "bytes_model": ("number", "bytes the backend family's algorithm moves"),
    "bytes_measured": ("number", "DRAM bytes read + written from Nsight Compute (hbm stage), else NaN"),
    "gbps": ("number", "bytes_model / median time / 1e9"),
    "intensity": ("number", "flops / bytes_model"),
    "bound": ("string", "memory, compute, latency or unknown"),
    "frac_of_peak": ("number", "achieved FLOP/s over the roofline at this intensity"),
    "peak_flops": ("number", "measured matmul ceiling for the dtype the backend computes in (compute_dtype), FLOP/s"),
    "peak_bytes_per_s": ("number", "measured copy bandwidth, bytes/s"),
    # energy and telemetry while timing (attnbench.bench.telemetry)
    "energy_j": ("number", "energy per call from NVML's energy counter over timing.energy_ms of back-to-back calls, J"),
    "tflop_per_j": ("number", "flops / energy_j / 1e12"),
    "sm_clock_mhz": ("number", "mean SM clock sampled by NVML while the rounds ran (CUDA)"),
    "cpu_clock_mhz": ("number", "mean core frequency at the start and end of each round, where Linux exposes it (CPU)"),
    "power_w": ("number", "mean board power sampled while timing (NVML instantaneous reading where the driver has it)"),
    "temp_c": ("number", "highest GPU temperature sampled while timing"),
    "throttle_share": ("number", "share of samples with a throttle reason (power cap, thermal or hardware slowdown)"),
    "other_processes": ("number", "most other processes NVML listed on the device while timing (CUDA)"),
    "other_cpu_share": ("number", "CPU time of other processes over the rounds, as a share of the machine's CPUs"),
    "device_shared": ("boolean", "another process used the device while it was timed (CUDA: other_processes > 0; "
                                 "CPU: other_cpu_share over 10%)"),
    "timing_lock": ("boolean", "the job held its device's timing lock (attnbench lease) while it timed"),
    "job_id": ("string", "the job process that timed the row: rows of one job_id and case were interleaved and pair up"),
    # memory
    "peak_mem_bytes": ("number", "peak allocated device memory during one call, inputs included (CUDA only)"),
    # numerics
    "numerics_status": ("string", "one of " + ", ".join(NUMERICS_STATUSES) + ": the check apart from the timing, so "
                                  "that a timed row is never oom because of its reference"),
    "numerics_reason": ("string", "why numerics_status is not ok (empty when ok)"),
    "rel_err": ("number", "||out - ref||_F / ||ref||_F against fp64"),
    "max_abs_err": ("number", "max |out - ref| against fp64"),
    "err_ratio_vs_math": ("number", "rel_err over sdpa-math's rel_err in the same dtype"),
    "err_ratio_vs_eager": ("number", "worst error (output or gradient) over eager's in the same dtype: the gate "
                                     "(at most max_err_ratio) for backends computing in the case dtype"),
    "err_ratio_vs_best_fused": ("number", "worst error (output or gradient) over the most accurate fused backend of "
                                          "the same job, case and dtype (reported, not gated)"),
    "max_err_ratio": ("number", "the gate this row was held to (config max_err_ratio); NaN for fp8 backends, gated "
                                "on rel_err <= numerics.FP8_REL_ERR_BOUND instead"),
    "rel_err_dq": ("number", "dQ relative error (fwd_bwd)"),
    "rel_err_dk": ("number", "dK relative error (fwd_bwd)"),
    "rel_err_dv": ("number", "dV relative error (fwd_bwd)"),
    "err_ratio_dq": ("number", "dQ error over sdpa-math's"),
    "err_ratio_dk": ("number", "dK error over sdpa-math's"),
    "err_ratio_dv": ("number", "dV error over sdpa-math's"),
    # provenance
    "device": ("string", "cuda or cpu"),
    "device_name": ("string", "GPU or CPU name"),
    "driver": ("string", "NVIDIA driver version"),
    "sm_clock_start_mhz": ("number", "SM clock at the start of the first round"),
    "sm_clock_end_mhz": ("number", "SM clock at the end of the last round"),
    "job_drift": ("number", "relative change of the job's reference case time from its first timing to the end of the "
                            "job (for a job stopped part-way, to the end of the row's case)"),
    "drift_flag": ("boolean", "|job_drift| over timing.DRIFT_LIMIT (3%): the job's clocks moved; compare its rows with care"),
    "torch_version": ("string", "torch version"),
    "cuda_version": ("string", "CUDA version torch was built with"),
    "cudnn_version": ("string", "cuDNN version"),
    "triton_version": ("string", "Triton version"),
    "python_version": ("string", "Python version"),
    "git_sha": ("string", "attnbench commit"),
    "host": ("string", "host name"),
    "gpu": ("string", "the GPU the row ran on, NVML's UUID (else its index); with host, where the row ran; empty on a CPU"),
    "timestamp": ("string", "UTC time the row was measured"),
    "kernels": ("string", "kernel (CUDA) or ATen op (CPU) names seen by the profiler, ';'-joined"),
}

REQUIRED = ("case_id", "backend", "status", "mode", "layout", "dtype")


class ResultsError(ValueError):
    pass


def case_columns(case: Case) -> dict:
    """A case's columns of a results row: its fields (per-sequence lengths as comma-separated text) and
    its batch shape summary."""
    columns = case.fields()
    columns.update(seq_lens_q=",".join(map(str, case.seq_lens_q)), seq_lens_kv=",".join(map(str, case.seq_lens_kv)),
                   tokens_q=sum(case.lens_q), tokens_kv=sum(case.lens_kv),
                   seq_q_median=float(statistics.median(case.lens_q)),
                   seq_kv_median=float(statistics.median(case.lens_kv)))
    return columns


def empty_row() -> dict:
    return {name: (float("nan") if kind == "number" else None) for name, (kind, _) in COLUMNS.items()}


def _array_cell(value):
    """A list cell as a list of floats (parquet gives numpy arrays back); None when missing."""
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA:
        return None
    return [float(v) for v in value]


def typed_columns(df: pd.DataFrame, columns: dict[str, tuple[str, str]]) -> pd.DataFrame:
    """``df`` with every one of ``columns`` (name -> (kind, meaning)) present and cast to its kind, in place."""
    for name, (kind, _) in columns.items():
        if name not in df:
            df[name] = float("nan") if kind == "number" else None
        if kind == "number":
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
        elif kind == "integer":
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("Int64")
        elif kind == "boolean":
            df[name] = df[name].astype("boolean")
        elif kind == "array":
            df[name] = df[name].map(_array_cell).astype(object)
        else:
            df[name] = df[name].astype("string")
    return df


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows to a frame with every column, in :data:`COLUMNS` order, extra columns kept after."""
    df = typed_columns(pd.DataFrame(rows), COLUMNS)
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[list(COLUMNS) + extra]


def validate_rows(df: pd.DataFrame, source: str = "results") -> None:
    """One-line errors for a frame that is not a results table."""
    missing = [c for c in REQUIRED if c not in df]
    if missing:
        raise ResultsError(f"{source}: missing column {missing[0]!r}; required: {', '.join(REQUIRED)}")
    bad = sorted(set(df["status"].dropna()) - set(STATUSES))
    if bad:
        raise ResultsError(f"{source}: status={bad[0]!r} is not allowed; allowed: {', '.join(STATUSES)}")
    if df["status"].isna().any():
        raise ResultsError(f"{source}: a row has no status; allowed: {', '.join(STATUSES)}")


def _parquet_encodings(df: pd.DataFrame) -> dict:
    """Parquet encodings per column: BYTE_STREAM_SPLIT for float columns whose values are mostly distinct, the
    dictionary for the rest.

    A float column of measurements (a training run's loss, gradient norm, step time at every step) barely repeats,
    so its dictionary falls back to plain values, whose mixed bytes zstd hardly shrinks; BYTE_STREAM_SPLIT stores the
    k-th byte of every value together (Apache Parquet, "Encodings": the sign, exponent and high mantissa bytes of
    neighbouring values are alike), which zstd does shrink. Lossless either way. With zstd, the committed reference
    rows take 19.0 MB instead of 24.9 MB (steps of 10,000-step runs a third smaller); a column that repeats (FP8
    overflow shares, configuration) keeps the dictionary, which is smaller there.
    """
    split = [c for c in df.columns if pd.api.types.is_float_dtype(df[c]) and df[c].nunique() > len(df) / 2]
    return {"use_byte_stream_split": split or False, "use_dictionary": [c for c in df.columns if c not in split]}


def write_atomic(df: pd.DataFrame, path: str | Path) -> None:
    """Write parquet via a temporary file in the same folder and rename: never a half-written file.

    Compressed with zstd, and small because the committed reference rows travel with every GPU call, whose copy of
    the tree has a size limit: see :func:`_parquet_encodings`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        df.to_parquet(tmp, engine="pyarrow", index=False, compression="zstd", **_parquet_encodings(df))
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_results(path: str | Path) -> pd.DataFrame:
    from attnbench.files import read_parquet

    df = read_parquet(path)
    validate_rows(df, str(path))
    return df
