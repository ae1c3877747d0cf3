"""Compare: AR and DDTree token by token, the first divergence, and the greedy-exact verdict."""
import streamlit as st

from profiling.metrics import summarize
from ui import state, views

st.title("Compare")
st.caption("The same prompt and settings decoded with plain greedy AR and with DDTree. Under greedy decoding "
           "DDTree must emit exactly the AR tokens, whatever the drafter proposes.")
ar, dd = state.pair()
summary = summarize(ar, dd)
exact, sentence = views.verdict(summary)
(st.success if exact else st.error)(sentence, icon=":material/check_circle:" if exact else ":material/error:")

div = summary["first_divergence"]
if div is not None:
    c1, c2, c3 = st.columns(3)
    c1.metric("First divergence at position", div["position"])
    c2.metric("AR top-1/top-2 logit gap there", "n/a" if div["logit_gap"] is None else f"{div['logit_gap']:.4g}")
    c3.metric("DDTree step that committed it", "prefill" if div["ddtree_step"] is None else div["ddtree_step"])

rows = views.compare_rows(ar, dd)
st.metric("Positions equal", f"{sum(r['equal'] for r in rows)} / {len(rows)}")
st.dataframe(rows, hide_index=True, width="stretch", height="content",
             column_config={"equal": st.column_config.CheckboxColumn(),
                            "AR top-1/top-2 gap": st.column_config.NumberColumn(format="%.4f")})
