"""DDTree Studio: `streamlit run app.py`. The router: per-tab state, the shared sidebar, then the chosen page."""
import streamlit as st

from ui import settings, state

st.set_page_config(page_title="DDTree Studio", page_icon="🌳", layout="wide")
state.init()
settings.init_widgets()

page = st.navigation([
    st.Page("app_pages/decode.py", title="Decode", icon="▶️", default=True),
    st.Page("app_pages/profile.py", title="Profile", icon="⏱️"),
    st.Page("app_pages/compare.py", title="Compare", icon="⚖️"),
    st.Page("app_pages/report.py", title="Report", icon="📄"),
])
notice = state.apply(settings.sidebar())
if notice:
    st.info(notice, icon="🔄")
if state.settings() is None:
    st.warning("Enter a valid prompt in the sidebar to decode.")
    st.stop()
page.run()
