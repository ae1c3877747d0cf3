"""Decode: step through DDTree (or the chain) and inspect each step's tree, mask, accepted path and timings."""
import streamlit as st

from profiling.metrics import num_dropped
from ui import charts, state, tree_panel, views
from ui.safe_text import plain
from ui.step_cache import cached

s = state.settings()
tokenizer = state.tokenizer()
piece = views.piece_of(tokenizer)
st.title("Decode")
st.caption(f"{plain(s.model)} · prompt of {len(s.prompt)} tokens · {plain(s.drafter.label())} drafter · "
           f"{s.stepped_mode} · B = {s.config.budget_label}, block size {s.config.block_size} · "
           f"{s.config.sampling} · "
           f"{s.config.device} {s.config.dtype}")

reset_col, step_col, n_col, run_col, end_col = st.columns([1, 1, 1, 1, 1.2], vertical_alignment="bottom")
n_col.number_input("N", min_value=1, max_value=1000, value=5, key="run_n")
finished = state.done()
# Reset, Step and Run N act in their callbacks, before this script runs, so a click costs one run; Run to end acts
# here, where its progress bar can draw, then runs the page again from the new state
reset_col.button("Reset", width="stretch", on_click=state.reset)
step_col.button("Step", type="primary", disabled=finished, width="stretch", on_click=state.advance_before_run,
                args=(1,))
run_col.button("Run N", disabled=finished, width="stretch",
               on_click=lambda: state.advance_before_run(int(st.session_state.run_n)))
if end_col.button("Run to end", disabled=finished, width="stretch"):
    bar = st.progress(0.0, text="Decoding...")

    def show(step) -> None:
        num_tokens = len(state.generated(s.config.max_new_tokens))
        bar.progress(num_tokens / s.config.max_new_tokens,
                     text=f"Step {step.index}: {num_tokens}/{s.config.max_new_tokens} tokens")

    if state.advance(None, on_step=show):
        st.session_state.inspect_step = len(state.steps()) - 1
        st.rerun()
state.show_failure()

steps = state.steps()
tokens = state.generated(s.config.max_new_tokens)
m1, m2, m3, m4 = st.columns(4)
m1.metric("Steps", len(steps))
m2.metric("Tokens generated", f"{len(tokens)} / {s.config.max_new_tokens}")
tau, beside_tau = state.tau()
m3.metric("Mean committed per step (tau)", views.number(tau, ".2f"), delta=beside_tau, delta_color="off",
          delta_arrow="off")
m4.metric("Status", "done" if state.done() else ("ready" if not steps else "running"))
if not steps:
    st.info("Press **Step** to prefill the prompt and run the first DDTree step.")
    st.stop()

st.subheader("Committed tokens")
st.html(views.tokens_html(tokens, piece))
st.caption("Coloured by the step that committed them (grey: the prefill's token). Hover a token for its id and "
           "step." + ("" if piece is None else " Pieces show a space as ·, a newline as ↵, a tab as →."))
if tokenizer is not None:
    with st.container(key="text"):
        st.html(views.text_html(tokenizer.decode(s.prompt), tokenizer.decode(t for t, _ in tokens)))

if not 0 <= st.session_state.get("inspect_step", -1) < len(steps):
    st.session_state.inspect_step = len(steps) - 1
index = st.selectbox("Inspect step", range(len(steps)), key="inspect_step",
                     format_func=lambda i: f"step {i}" + (" (latest)" if i == len(steps) - 1 else ""))
step = steps[index]
dropped = num_dropped(steps, index, s.config.max_new_tokens)
st.markdown(views.tree_caption(step, piece, dropped))
tree_panel.section(step, piece)

a, c, t = st.columns(3)
a.metric("Drafted tokens accepted", step.num_accepted)
c.metric("Tokens committed", step.num_committed - dropped)
t.metric("Step time", f"{step.step_ns / 1e6:.2f} ms" if "step" in step.timings_ns else "-")
st.dataframe(views.stage_rows(step), hide_index=True, width="stretch", height="content",
             column_config={"ms": st.column_config.NumberColumn(format="%.3f"),
                            "share": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")})

if step.budget is not None:
    st.subheader("Budget choice (auto)")
    choice = step.budget
    verified = step.tree.num_nodes - 1
    st.caption(f"This step {'drafted and ' if choice.drafted else 'took an AR step without a draft, '}chose "
               f"b = {choice.chosen} of {choice.buckets} and verified {verified} drafted nodes. Expected tokens: 1 + "
               "the summed probabilities of the first b nodes' paths (the drafter's marginals, corrected per depth "
               "and rank by what the run realised); predicted ms: the step time measured at each budget; the "
               "chosen b has the most expected tokens per second (b = 0 backs off to AR steps, which verify the "
               "smallest tree when they probe).")
    st.plotly_chart(cached("budget_choice", step, None, lambda: charts.budget_choice(choice)), width="stretch",
                    key="budget_choice")
    st.plotly_chart(cached("budget_confidence", steps[-1], None, lambda: charts.budget_confidence(steps)),
                    width="stretch", key="budget_confidence")

if step.probs is not None and s.config.temperature > 0:
    st.subheader("Probabilities")
    st.caption("At T > 0 the target samples, so acceptance is a chance. Expected accepted: the sum over drafted "
               "nodes of the chance the walk reaches and accepts each (the target's probabilities); the drafter's "
               "surrogate: the same sum from the drafter's own cumulative probabilities.")
    e1, e2, e3 = st.columns(3)
    e1.metric("Expected accepted (target)", f"{step.probs.expected_accepted:.2f}")
    e2.metric("Drafter's surrogate", f"{step.probs.draft_expected:.2f}")
    e3.metric("Accepted (realised)", step.num_accepted)
    st.plotly_chart(cached("expected_acceptance", steps[-1], None, lambda: charts.expected_acceptance(steps)),
                    width="stretch", key="expected_acceptance")
    fmt = st.column_config.NumberColumn(format="%.4f")
    st.dataframe(cached("node_probs", step, None, lambda: views.node_prob_rows(step, piece)), hide_index=True,
                 width="stretch", key="node_probs",
                 column_config={"target p": fmt, "drafter marginal": fmt, "moves on": fmt,
                                "accepted": st.column_config.CheckboxColumn()})
