"""The Profile page's stages against their bytes floor (profiling/stage_floor.py): one run's stages, each with its
mean time, the bytes it reads, their floor at the copy bandwidth and time / floor, so the stage off its floor shows
first. The bandwidth is measured here once per device (profiling/bandwidth.py); a recording from another machine
takes the one its user types."""
from __future__ import annotations

import streamlit as st

from engine.records import RunRecord
from profiling.bandwidth import Bandwidth, bandwidth_here
from profiling.stage_floor import FloorModel, stage_floors

KEY = "floor_bandwidth_gbps"


def rows(run: RunRecord, bandwidth: Bandwidth) -> list[dict]:
    """The table's rows: the verify's parts indented under it."""
    out = []
    for r in stage_floors(FloorModel.of_run(run), run.steps, bandwidth):
        name = "\u2003" + r.stage.removeprefix("verify/") if r.stage.startswith("verify/") else r.stage
        out.append({"stage": name, "steps": r.num_steps, "ms/step": r.time_ms,
                    "MB read": None if r.num_bytes is None else r.num_bytes / 1e6, "floor ms": r.floor_ms,
                    "time/floor": r.over_floor})
    return out


def section(run: RunRecord, label: str, recorded: bool) -> None:
    st.subheader("Stages against their bytes floor")
    device, dtype = str(run.decode["device"]), str(run.decode["dtype"])
    here = bandwidth_here(device, dtype)
    gbps = st.number_input("Copy bandwidth (GB/s, read + written)", min_value=0.001, key=KEY,
                           value=round(here.bytes_per_s / 1e9, 3) if here is not None else 1000.0,
                           help="The floor's divisor: measured here by a device-to-device copy; for a recording "
                                "made elsewhere, type its machine's")
    bandwidth = Bandwidth(gbps * 1e9, device, dtype, here.copy_bytes if here else 0, here.num_reps if here else 0)
    source = (f"measured here ({here.text()})" if here is not None and abs(gbps - round(here.bytes_per_s / 1e9, 3))
              < 1e-9 else "as typed")
    st.caption(f"The {label} run's stages, mean per step that ran them: the bytes each must read (every weight it "
               "touches once, routed experts as touched x one expert's bytes, the embedding's rows only, the cache "
               f"rows it attends over) at {gbps:.1f} GB/s, {source}; time/floor says how far each stage is off its "
               "floor." + (" A recording: its times come from the machine that made it, so give that machine's "
                           "bandwidth." if recorded else ""))
    st.dataframe(rows(run, bandwidth), hide_index=True, width="stretch", height="content", key="stage_floors",
                 column_config={"ms/step": st.column_config.NumberColumn(format="%.3f"),
                                "MB read": st.column_config.NumberColumn(format="%.4g"),
                                "floor ms": st.column_config.NumberColumn(format="%.4f"),
                                "time/floor": st.column_config.NumberColumn(format="%.1fx")})
