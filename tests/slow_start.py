"""`streamlit run app.py ARGS...` with a slow first script run, as on a busy machine's first tab
(tests/test_browser.py).

The first checkpoint load sleeps DDTREE_TEST_FIRST_LOAD_S seconds (the kernel build's status fragment polls during
it), and every decode's prefill sleeps DDTREE_TEST_PREFILL_S seconds (a step's rerun lasts long enough to see what
the page shows meanwhile). Run from the checkout's root: `python tests/slow_start.py --server.port N ...`.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.getcwd())

from engine.loaders import loading  # noqa: E402 - the checkout's root is on the path first

FIRST_LOAD_S = float(os.environ.get("DDTREE_TEST_FIRST_LOAD_S", "0"))
PREFILL_S = float(os.environ.get("DDTREE_TEST_PREFILL_S", "0"))


def slowed_once(call, seconds: float):
    calls = []

    def slowed(*args, **kwargs):
        if not calls:
            calls.append(None)
            time.sleep(seconds)
        return call(*args, **kwargs)
    return slowed


def slowed_always(call, seconds: float):
    def slowed(*args, **kwargs):
        time.sleep(seconds)
        return call(*args, **kwargs)
    return slowed


loading.load_model = slowed_once(loading.load_model, FIRST_LOAD_S)  # before ui.resources binds it

from streamlit.web.cli import main  # noqa: E402

from ui.current import Live  # noqa: E402

Live.start = slowed_always(Live.start, PREFILL_S)

if __name__ == "__main__":
    sys.argv = ["streamlit", "run", "app.py", *sys.argv[1:]]
    sys.exit(main())
