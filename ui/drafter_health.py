"""The Profile page's drafter-health panel: profiling.drafter_health's checks of the sidebar's DFlash drafter on the
sidebar's target, prompt and decode settings, run on request (each check decodes the prompt again)."""
from __future__ import annotations

import streamlit as st

from profiling.drafter_health import OK, check_drafter
from ui import recorded, resources
from ui.settings import Settings, checkpoint
from ui.state import show_error


def panel(s: Settings) -> None:
    """Shown when the drafter is dflash; the last result is kept for as long as the settings stay the same."""
    if s.drafter.name != "dflash":
        return
    st.subheader("Drafter health")
    st.caption("Integration slips that lower acceptance without changing a token: the target layer ids against "
               "ids shifted by -1 and +1, the mask token's embedding row, the RoPE the drafter uses, the block size "
               "and the target's depth. CLI: `python -m engine drafter-check`.")
    ss = st.session_state
    needs_model = recorded.needs_model()
    if st.button("Check the drafter", disabled=bool(needs_model), help=needs_model):
        with st.spinner("Decoding the prompt with the drafter and its variants..."):
            try:
                model = resources.target_model(s.model_id, checkpoint(s.model), s.device, s.dtype)
                ss.drafter_health = (s, check_drafter(model, list(s.prompt), s.decode_config(), s.drafter.model,
                                                      s.stepped_mode))
            except Exception as exc:  # noqa: BLE001 - shown as a message; the rest of the page still works
                ss.drafter_health = None
                show_error(exc)
    result = ss.get("drafter_health")
    if result is None or result[0] != s:
        return
    checks = result[1]
    warned = [c.name for c in checks if c.verdict != OK]
    if warned:
        st.warning(f"{len(warned)} of {len(checks)} checks warn: {', '.join(warned)}.")
    else:
        st.success(f"All {len(checks)} checks ok.")
    st.dataframe([{"verdict": c.verdict, "check": c.name, "found": c.found, "rule": c.rule} for c in checks],
                 hide_index=True, width="stretch")
