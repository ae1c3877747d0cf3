"""DDTree Studio: `streamlit run app.py`. The router: per-tab state, the shared sidebar, then the chosen page.

The page's top holds two slots drawn in every run (the kernel build's message, then the notices), so the page's
own elements keep their places whatever a run says: a shifted element is drawn anew and its old copy stays on
screen, faded, until the run ends (two rows of controls during a step, a click on the old row lost)."""
import pandas  # noqa: F401 - imported once here: plotly imports it lazily, and several sessions' script threads
import plotly.express  # noqa: F401 - importing it at once on a cold server hit "partially initialized module"
import streamlit as st

from ui import kernel_status, query, recorded, settings, state
from ui.safe_text import plain

st.set_page_config(page_title="DDTree Studio", layout="wide")
state.init()
query.restore()
settings.init_widgets()
kernel_status.show()
notices = st.container(key="notices")

page = st.navigation([
    st.Page("app_pages/decode.py", title="Decode", default=True),
    st.Page("app_pages/profile.py", title="Profile"),
    st.Page("app_pages/compare.py", title="Compare"),
    st.Page("app_pages/report.py", title="Report"),
])
recorded.sidebar()
chosen, invalid = settings.sidebar()
query.save()
with notices:
    for notice in (query.notice(), state.apply(chosen)):
        if notice:
            st.info(plain(notice))
    recorded.banner()
    if state.settings() is None:
        st.warning(f"Decoding waits for a valid {' and a valid '.join(invalid)}: the sidebar says what is wrong.")
        st.stop()
page.run()
