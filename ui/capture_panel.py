"""The Profile page's torch.profiler section: a capture taken on request by profiling.measure (as `python -m engine
run --profile` takes it), kept with the tab's current decode (a recording's is its own, if it was recorded with one),
and shown range by range (profiling.capture_view): device kernels on a GPU, the top CPU ops on the CPU."""
from __future__ import annotations

import streamlit as st

from engine.records import MODE_LABELS, RunRecord
from profiling import capture_view
from profiling.capture_data import Capture
from profiling.measure import measure
from ui import profile_jobs, state
from ui.current import request_of, target_model
from ui.safe_text import plain

MS = st.column_config.NumberColumn(format="%.3f")
DEVICE_COLUMNS = {"range": "range", "calls": "calls", "host_ms": "host ms", "kernels": "kernels",
                  "device_ms": "device ms (own)", "device_ms_with_children": "device ms (with child ranges)",
                  "gap_ms": "idle gaps ms", "mean_gap_us": "mean gap µs", "top_kernel": "top kernel"}
CPU_COLUMNS = {"range": "range", "calls": "calls", "host_ms": "host ms", "op_calls": "CPU op calls",
               "op_ms": "CPU ops ms", "top_op": "top CPU op"}


def take() -> None:
    """Decode AR and the settings' modes once more under torch.profiler and keep the capture for this tab."""
    shown = state.current()
    s = shown.settings
    names = " and ".join(MODE_LABELS[m] for m in s.modes)
    with st.spinner(f"Capturing AR and {names} with torch.profiler..."):
        try:
            shown.captured = measure(request_of(s), target_model(s), profile=True)
        except Exception as exc:  # noqa: BLE001 - every engine error becomes a message, never a raw exception
            state.show_error(exc)


def section() -> None:
    st.subheader("Kernels: torch.profiler capture")
    st.caption("A separate, fresh decode of AR and each mode under torch.profiler (what `python -m engine run "
               "--profile` records): on a GPU the device kernels inside each range, their launches, device time "
               "and the idle gaps between consecutive launches (host overhead), which verify_attn kernel and which "
               "tree_build path ran; on the CPU the top CPU ops per range. The profiler's overhead inflates its "
               "timings, so the numbers above come from runs without it.")
    needs_model = state.needs_model()
    blocked = needs_model or profile_jobs.busy()
    if st.button("Capture with torch.profiler", disabled=bool(blocked),
                 help=blocked or "Decode once more with torch.profiler recording"):
        take()
    got = state.current().captured
    if got is None:
        st.info("No capture for these settings yet: press **Capture with torch.profiler**." if needs_model is None
                else "The recording holds no torch.profiler capture (`run --profile --report DIR` records one).")
        return
    show(got.runs, got.capture)


def show(runs: dict[str, RunRecord], capture: Capture) -> None:
    on_device = "cuda" in capture.activities
    summaries = [capture_view.run_summary(runs[mode], rc, on_device) for mode, rc in capture.runs.items()]
    if on_device:
        st.caption(f"Captured activities: {', '.join(capture.activities)}. Device kernels per range; a gap is the "
                   "device's idle time between two consecutive kernels of one range occurrence on one stream.")
        st.dataframe(summaries, hide_index=True, width="stretch", height="content", key="capture_summary",
                     column_config={"step_host_ms": st.column_config.NumberColumn("host ms (steps)", format="%.3f"),
                                    "device_ms": MS, "gap_ms": st.column_config.NumberColumn("idle gaps ms",
                                                                                           format="%.3f"),
                                    "busy": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0,
                                                                            format="percent")})
    else:
        st.caption("A CPU capture: no device kernels. These are **CPU ops** (torch.profiler's host events), the "
                   "top-level ops called directly inside each range; verify_attn's kernel and tree_build's path "
                   "show on a CUDA capture.")
        st.dataframe(summaries, hide_index=True, width="stretch", height="content", key="capture_summary",
                     column_config={"step_host_ms": st.column_config.NumberColumn("host ms (steps)", format="%.3f"),
                                    "ops": "CPU op calls", "op_ms": st.column_config.NumberColumn(
                                        "CPU ops ms", format="%.3f"), "top_ops": "top CPU ops"})
    labels = {MODE_LABELS[m]: m for m in reversed(capture.runs)}
    mode = labels[st.radio("Captured run", list(labels), key="capture_run", horizontal=True)]
    rc = capture.runs[mode]
    rows = capture_view.range_rows(runs[mode], rc, on_device)
    columns = DEVICE_COLUMNS if on_device else CPU_COLUMNS
    st.dataframe([{columns[k]: ("\u2003" * r["depth"] + r[k] if k == "range" else r[k]) for k in columns}
                  for r in rows], hide_index=True, width="stretch", key="capture_ranges",
                 column_config={label: MS for key, label in columns.items() if key.endswith("_ms")})
    own = "device_ms" if on_device else "op_ms"
    timed = [r for r in rows if r[own] > 0]
    if not timed:
        st.info("The profiler attributed nothing to these ranges.")
        return
    if st.session_state.get("capture_range") not in {r["range"] for r in timed}:  # the busiest range of a step
        st.session_state.capture_range = max(timed, key=lambda r: (r["range"].startswith("step"), r[own]))["range"]
    name = st.selectbox("Range", [r["range"] for r in timed], key="capture_range",
                        help="The ranges that launched something themselves, in the table's order")
    if on_device:
        st.caption(f"Kernels launched directly in {plain(name)} (not in its child ranges), most device time first.")
        st.dataframe(capture_view.kernel_rows(rc, name), hide_index=True, width="stretch", height="content",
                     key="capture_kernels", column_config={
                         "device_ms": MS, "mean_us": st.column_config.NumberColumn("mean µs", format="%.2f"),
                         "share": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")})
    else:
        st.caption(f"The top {capture_view.TOP_OPS} CPU ops called directly in {plain(name)}, most host time first.")
        st.dataframe(capture_view.op_rows(rc, name), hide_index=True, width="stretch", height="content",
                     key="capture_ops", column_config={
                         "cpu_ms": st.column_config.NumberColumn("CPU ms", format="%.3f"),
                         "mean_us": st.column_config.NumberColumn("mean µs", format="%.2f"),
                         "share": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")})
