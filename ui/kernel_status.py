"""The message about the background kernel build (resources.kernel_build), in a slot of its own at the top of every
page: while it runs, a fragment polled every two seconds says who builds (this server, or another process holding
the builders' lock, by pid); once it is done, the message goes and a toast says so.

The fragment redraws only itself and never reruns the app: a full rerun sent right after a new tab's first run
reached the browser before its sidebar widgets had mounted, and they came up at their protos' defaults (every
number at its minimum, an empty prompt) while the server held the real values; the next click sent those back."""
from __future__ import annotations

import os

import streamlit as st

import kernels
from ui import resources

POLL_S = 2.0
WAS_BUILDING = "kernels_were_building"  # session key: this tab showed the message, so it gets the toast


def show() -> None:
    with st.container(key="kernel_status"):  # always drawn: the page below never shifts when the message goes
        if not resources.kernel_build().done:
            _poll()
        elif st.session_state.pop(WAS_BUILDING, False):
            _toast()


@st.fragment(run_every=POLL_S)
def _poll() -> None:
    build = resources.kernel_build()
    if build.done:  # the message goes with this fragment's redraw; the next full run stops the polling
        if st.session_state.pop(WAS_BUILDING, False):
            _toast()
        return
    st.session_state[WAS_BUILDING] = True
    st.info(message(build.seconds))


def message(seconds: float) -> str:
    """What the build is doing, and who holds the builders' lock (kernels.build_holder)."""
    build_dir, pid = kernels.build_holder()
    if pid is None:
        who = "loading them"
    elif pid == os.getpid():
        who = f"this server (process {pid}) holds the build lock"
    else:
        who = f"waiting for process {pid}, which holds the build lock (another server or command building them)"
    return (f"Building the DDTree kernels in the background (the ddtree_ops C++/CUDA extension, kernels/csrc, in "
            f"{build_dir}): {who}. Usually about a minute the first time, a few seconds once cached. Running for "
            f"{seconds:.0f} s; a decode started now waits for it.")


def _toast() -> None:
    build = resources.kernel_build()
    outcome = "failed: a decode shows why" if build.error else "done"
    st.toast(f"The DDTree kernel build is {outcome} ({build.seconds:.0f} s).")
