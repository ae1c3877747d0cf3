"""The Profile page's drafter-health panel: profiling.drafter_health's checks of the sidebar's DFlash drafter on the
sidebar's target, prompt and decode settings, run on request (each check decodes the prompt again)."""
from __future__ import annotations

import streamlit as st

from profiling.drafter_health import OK, check_drafter
from ui import profile_jobs, state
from ui.current import request_of, target_model
from ui.settings import Settings


def panel(s: Settings) -> None:
    """Shown when the drafter is dflash; the last result is kept for as long as the settings stay the same."""
    if s.drafter.name != "dflash":
        return
    st.subheader("Drafter health")
    st.caption("Integration slips that lower acceptance without changing a token: the target layer ids against "
               "ids shifted by -1 and +1, the mask token's embedding row, the RoPE the drafter uses, the block size "
               "and the target's depth. CLI: `python -m engine drafter-check`.")
    shown = state.current()
    blocked = shown.needs_model() or profile_jobs.busy()
    if st.button("Check the drafter", disabled=bool(blocked), help=blocked):
        with st.spinner("Decoding the prompt with the drafter and its variants..."):
            try:
                request = request_of(s)
                shown.health = check_drafter(target_model(s), request.prompt, request.config, request.drafter.model,
                                             request.primary)
            except Exception as exc:  # noqa: BLE001 - shown as a message; the rest of the page still works
                shown.health = None
                state.show_error(exc)
    checks = shown.health
    if checks is None:
        return
    warned = [c.name for c in checks if c.verdict != OK]
    if warned:
        st.warning(f"{len(warned)} of {len(checks)} checks warn: {', '.join(warned)}.")
    else:
        st.success(f"All {len(checks)} checks ok.")
    st.dataframe([{"verdict": c.verdict, "check": c.name, "found": c.found, "rule": c.rule} for c in checks],
                 hide_index=True, width="stretch")
