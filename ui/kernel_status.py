"""The message about the background kernel build (resources.kernel_build): shown while it runs, polled every two
seconds, and a notice once it is done."""
from __future__ import annotations

import streamlit as st

from ui import resources

POLL_S = 2.0


def show() -> None:
    build = resources.kernel_build()
    if not build.done:
        _poll()
    elif st.session_state.pop("kernels_were_building", False):
        outcome = "failed: a decode shows why" if build.error else "done"
        st.toast(f"The DDTree kernel build is {outcome} ({build.seconds:.0f} s).")


@st.fragment(run_every=POLL_S)
def _poll() -> None:
    build = resources.kernel_build()
    if build.done:
        st.rerun(scope="app")
    st.session_state.kernels_were_building = True
    st.info(f"Building the DDTree kernels in the background (the ddtree_ops C++/CUDA extension, kernels/csrc): "
            f"usually about a minute the first time, a few seconds once cached. Running for {build.seconds:.0f} s; "
            "a decode started now waits for it.")
