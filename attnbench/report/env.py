"""The environment of a sweep as tables: the roofline ceilings measured before any benchmark, the
versions and provenance, and every backend's availability (with the reason where it cannot run).

Read from ``results/<sweep>/env/{ceilings,versions}.json`` (``attnbench ceilings``, ``attnbench env``).
"""
from __future__ import annotations

import pandas as pd

from attnbench.report.artifacts import StageOutputs, Table, fmt, frame_table

PROVENANCE = ("device", "device_name", "driver", "torch_version", "cuda_version", "cudnn_version", "triton_version",
              "python_version", "git_sha", "host", "why", "sweep")


def ceilings_table(ceilings: dict) -> Table:
    bandwidth = ceilings["copy_bytes_per_s"]
    rows = [{"ceiling": "copy bandwidth (read + write)", "value": bandwidth / 1e9, "unit": "GB/s", "ridge": None}]
    for dtype, rate in ceilings.get("matmul_flops_per_s", {}).items():
        rows.append({"ceiling": f"matmul {dtype}", "value": rate / 1e12, "unit": "TFLOP/s", "ridge": rate / bandwidth})
    values = pd.DataFrame(rows).set_index("ceiling").rename(columns={"ridge": "ridge point (FLOP/byte)"})
    caption = (f"Roofline ceilings measured on {ceilings.get('device_name', 'this host')} at "
               f"{ceilings.get('measured_at', 'the start of the sweep')}: device copy bandwidth (bytes read plus "
               "written) and dense matmul rate per dtype, and the ridge point each gives (peak / bandwidth). Every "
               "row's bound and fraction of peak use them.")
    return Table("ceilings", caption, values, values.map(fmt))


def provenance_table(versions: dict) -> Table:
    values = pd.DataFrame({"value": [str(versions.get(k, "")) for k in PROVENANCE]}, index=pd.Index(PROVENANCE,
                                                                                                      name="field"))
    packages = versions.get("packages", {})
    extra = pd.DataFrame({"value": [str(v) for v in packages.values()]},
                         index=pd.Index([f"package {k}" for k in packages], name="field"))
    values = pd.concat([values, extra])
    return Table("provenance", "Where and with what the sweep ran: device, driver and library versions, the git "
                 "commit, host, why this device's grid was chosen, and the installed packages.", values, values)


def backends_table(versions: dict) -> Table:
    rows = [{"backend": name, "available": bool(info.get("available")), "version": info.get("version") or "",
             "reason": info.get("reason") or ""} for name, info in versions.get("backends", {}).items()]
    values = pd.DataFrame(rows, columns=["backend", "available", "version", "reason"]).set_index("backend")
    return frame_table("backends", "Every registered backend on this host: available or not, its version, and the "
                       "reason (with the install command) where it cannot run; an unavailable backend named in a "
                       "grid is a row with status unavailable, never a missing one.", values)


def build(ceilings: dict, versions: dict) -> StageOutputs:
    return StageOutputs([ceilings_table(ceilings), provenance_table(versions), backends_table(versions)])
