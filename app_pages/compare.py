"""Compare: AR and the speculative runs token by token, the first divergence, and the greedy-exact verdicts."""
import streamlit as st

from engine.records import MODE_LABELS
from profiling.divergence import NEAR_TIE
from ui import source, state, views

st.title("Compare")
st.caption("The same prompt and settings decoded with plain AR and with the drafter (DDTree's tree and/or the "
           "chain). Greedy (T = 0), each must emit exactly the AR tokens whatever the drafter proposes; sampled "
           "(T > 0), the check is seed-matched: AR and the speculative run draw the same noise per position.")
measurement = source.stepped() if source.pick("compare_source") == source.STEPPED else state.measured()
for mode, summary in measurement.summaries.items():
    exact, sentence = views.verdict(summary)
    near_tie = not exact and summary["first_divergence"]["kind"] == NEAR_TIE
    if exact:
        st.success(sentence)
    else:
        (st.warning if near_tie else st.error)(views.divergence_warning(summary))
    div = summary["first_divergence"]
    if div is not None:
        c1, c2, c3 = st.columns(3)
        c1.metric(f"{MODE_LABELS[mode]}: first divergence at position", div["position"])
        c2.metric("AR top-1/top-2 logit gap there", "n/a" if div["logit_gap"] is None else f"{div['logit_gap']:.4g}")
        c3.metric(f"{MODE_LABELS[mode]} step that committed it", "prefill" if div["step"] is None else div["step"])

rows = views.compare_rows(measurement.runs)
st.metric("Positions equal", f"{sum(r['equal'] for r in rows)} / {len(rows)}")
st.dataframe(rows, hide_index=True, width="stretch", height="content",
             column_config={"equal": st.column_config.CheckboxColumn(),
                            "AR top-1/top-2 gap": st.column_config.NumberColumn(format="%.4f")})
