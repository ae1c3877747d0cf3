"""Compare: AR and the speculative runs token by token, the first divergence, and the greedy-exact verdicts."""
import streamlit as st

from engine.records import MODE_LABELS
from profiling.divergence import NEAR_TIE
from profiling.token_diff import diff_html
from ui import compare_text, source, state, views

st.title("Compare")
st.caption("The same prompt and settings decoded with plain AR and with the drafter (DDTree's tree and/or the "
           "chain). Greedy (T = 0), each must emit exactly the AR tokens whatever the drafter proposes; sampled "
           "(T > 0), the check is seed-matched: AR and the speculative run draw the same noise per position.")
measurement = source.stepped() if source.pick("compare_source") == source.STEPPED else state.measured()
piece = views.piece_of(state.tokenizer())
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
        if piece is not None:
            st.caption(compare_text.divergence_tokens(div, MODE_LABELS[mode], piece))

runs = measurement.runs
ar = runs["ar"]
if ar.text is not None:
    st.subheader("Text")
    st.caption("The prompt (grey), then what AR generated.")
    st.html(views.text_html(ar.prompt_text, ar.text))
    for mode, run in runs.items():
        if mode == "ar":
            continue
        if run.tokens == ar.tokens:
            st.caption(f"{MODE_LABELS[mode]}: the same {len(run.tokens)} tokens as AR, so the same text.")
        else:
            st.caption(f"What {MODE_LABELS[mode]} generated:")
            st.html(views.text_html(run.prompt_text, run.text))

st.subheader("Tokens")
st.html(diff_html(runs, piece))
st.caption("Every generated token, AR first; red: a token that differs from AR's at that position. Hover a token "
           "for its position and id." + ("" if piece is None else " Pieces show a space as ·, a newline as ↵."))
rows = views.compare_rows(runs)
labels = [MODE_LABELS[m] for m in runs]
st.metric("Positions equal", f"{sum(r['equal'] for r in rows)} / {len(rows)}")
st.dataframe(compare_text.text_rows(rows, labels, piece), hide_index=True, width="stretch", height="content",
             column_config={"equal": st.column_config.CheckboxColumn(),
                            "AR top-1/top-2 gap": st.column_config.NumberColumn(format="%.4f")})
