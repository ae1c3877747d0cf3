"""The shared sidebar: which model, prompt, drafter and decode configuration every page works with."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import streamlit as st
import torch

from engine.checkpoint import Checkpoint
from engine.cli_options import TREES
from engine.config import DTYPES, MAX_BLOCK_SIZE, MAX_BUDGET, MIN_BLOCK_SIZE, DecodeConfig
from engine.dflash import check_fits, dflash_dir_beside, read_dflash_dir
from engine.dflash.fit import block_size_note
from engine.drafters import REGISTRY, DrafterSpec
from engine.session import parse_prompt
from ui import resources

DEFAULTS = DecodeConfig()
TREE_LABELS = {"tree": "DDTree", "chain": "chain", "both": "chain and DDTree"}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a decode depends on; any change starts the decode over."""

    model: str
    prompt: tuple[int, ...]
    drafter: DrafterSpec
    tree: str  # a cli_options.TREES key: which speculative modes run beside AR
    budget: int
    block_size: int
    max_new_tokens: int
    device: str
    dtype: str

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(budget=self.budget, block_size=self.block_size, max_new_tokens=self.max_new_tokens,
                            device=self.device, dtype=self.dtype)

    @property
    def modes(self) -> tuple[str, ...]:
        return TREES[self.tree]

    @property
    def stepped_mode(self) -> str:
        """The mode the Decode page steps through: DDTree when it runs, else the chain."""
        return self.modes[-1]


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def checkpoint(model: str) -> Checkpoint:
    """The checkpoint behind a sidebar model name: a bundled fixture or this tab's upload."""
    uploads = st.session_state.uploads
    if model in uploads:
        return uploads[model]
    return resources.bundled_checkpoint(str(resources.bundled_models()[model]))


def _on_upload() -> None:
    """Load an uploaded .kdtr with the CLI's loader. A bad file leaves the selected model as it was."""
    ss = st.session_state
    file = ss.upload
    ss.upload_error = None
    if file is None:
        return
    data = file.getvalue()
    name = f"{file.name} ({hashlib.sha256(data).hexdigest()[:8]})"
    try:
        ss.uploads[name] = resources.read_upload(file.name, data)
    except ValueError as exc:
        ss.upload_error = f"{file.name} was not loaded: {exc}"
        return
    ss.model = name


def _on_path() -> None:
    """Load a .kdtr file or a Hugging Face directory on this server. A bad path leaves the model as it was."""
    ss = st.session_state
    path = ss.model_path.strip()
    ss.upload_error = None
    if not path:
        return
    try:
        ss.uploads[path] = resources.load_path(path)
    except (ValueError, OSError) as exc:
        ss.upload_error = f"{path} was not loaded: {exc}"
        return
    ss.model = path


def _model() -> str:
    st.header("Model")
    names = [*resources.bundled_models(), *st.session_state.uploads]
    model = st.selectbox("Checkpoint", names, key="model", help="Bundled fixtures from tests/refs, or your uploads.")
    st.file_uploader("Upload a .kdtr", type=["kdtr"], key="upload", on_change=_on_upload,
                     help="Validated by the same loader as the CLI (engine.kdtr.read_kdtr).")
    st.text_input("Or load a path", key="model_path", on_change=_on_path,
                  placeholder="model.kdtr or a Hugging Face directory",
                  help="A .kdtr file or a Hugging Face DeepSeek-V3 / Kimi-K2 directory (config.json + safetensors) "
                       "on this server, loaded by engine.loading.load_model, as `run --model` does.")
    if st.session_state.upload_error:
        st.error(f"{st.session_state.upload_error} Still using {model}.")
    return model


def _prompt(vocab_size: int, fixture_prompt: list[int] | None) -> tuple[int, ...] | None:
    st.header("Prompt")
    sources = ["fixture prompt", "token ids"] if fixture_prompt is not None else ["token ids"]
    source = st.radio("Prompt", sources, key="prompt_source", horizontal=True, label_visibility="collapsed")
    if source == "fixture prompt":
        st.caption(f"{len(fixture_prompt)} tokens: {', '.join(map(str, fixture_prompt))}")
        return tuple(fixture_prompt)
    text = st.text_input("Token ids", key="prompt_text", placeholder="e.g. 3, 14, 15, 92",
                         help=f"Comma or space separated ids in [0, {vocab_size}).")
    try:
        return tuple(parse_prompt(text, vocab_size))
    except ValueError as exc:
        st.error(f"Prompt: {exc}")
        return None


def _drafter() -> DrafterSpec | None:
    """The drafter and the settings its registry entry reads; None (with the error shown) while they are bad. A
    drafter checkpoint box left empty, or still holding the last directory filled in for another target, is
    filled with the DFlash directory beside the target (engine.dflash.dflash_dir_beside), if it has one. A
    checkpoint is checked as it is typed: the loader's and the fit's errors show here, and decoding waits."""
    st.header("Drafter")
    ss = st.session_state
    name = st.selectbox("Drafter", list(REGISTRY), key="drafter", help=REGISTRY[ss.drafter].summary)
    fields = REGISTRY[name].fields
    values = {}
    if "noise" in fields:
        values["noise"] = float(st.slider("Noise", 0.0, 1.0, step=0.05, key="noise",
                                          help="Probability that the oracle demotes or drops the true token at a "
                                               "depth."))
    if "seed" in fields:
        values["seed"] = int(st.number_input("Seed", min_value=0, step=1, key="seed",
                                             help="Seeds the drafter's distractors."))
    target = checkpoint(ss.model)
    if "model" in fields:
        if ss.drafter_model in ("", ss.get("drafter_model_filled")):
            beside = dflash_dir_beside(target.source)
            ss.drafter_model = ss.drafter_model_filled = "" if beside is None else str(beside)
        values["model"] = st.text_input("Drafter checkpoint", key="drafter_model",
                                        help="A DFlash checkpoint directory on this server (config.json + "
                                             "safetensors, z-lab's layout); filled in when the target has one "
                                             "beside it: <target dir>/dflash/ or <target>-dflash/.").strip()
    try:
        spec = DrafterSpec(name, **values)
        if spec.model is not None:
            drafter = read_dflash_dir(spec.model)
            check_fits(drafter.config, target.config, drafter.source)
            note = block_size_note(drafter.config, ss.block_size)
            if note is not None:
                st.warning(f"Drafter: {note}.")
    except ValueError as exc:
        st.error(f"Drafter: {exc}")
        return None
    return spec


def sidebar() -> Settings | None:
    """Draw the sidebar; returns the chosen settings, or None while the prompt or the drafter is invalid."""
    with st.sidebar:
        model = _model()
        ckpt = checkpoint(model)
        fixture_prompt = None if ckpt.prompt is None else [int(t) for t in ckpt.prompt]
        prompt = _prompt(ckpt.config.vocab_size, fixture_prompt)
        drafter = _drafter()
        st.header("Decode")
        tree = st.radio("Verify", list(TREES), key="verify_tree", horizontal=True, format_func=TREE_LABELS.get,
                        help="The best-first tree (DDTree), the drafter's top-1 chain (DFlash's own verification), "
                             "or both beside AR on the Profile, Compare and Report pages.")
        budget = st.number_input("Budget B (tree nodes)", 0, MAX_BUDGET, step=1, key="budget",
                                 help="Drafted nodes per step, root excluded; 0 is plain AR.")
        block_size = st.number_input("Block size", MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, step=1, key="block_size",
                                     help="The drafter proposes block_size - 1 positions per step.")
        max_new_tokens = st.number_input("Max new tokens", 1, ckpt.config.max_position_embeddings, step=1,
                                         key="max_new_tokens")
        device = st.selectbox("Device", devices(), key="device", help="cuda is offered when torch sees a GPU.")
        dtype = st.selectbox("Dtype", list(DTYPES), key="dtype")
    if prompt is None or drafter is None:
        return None
    return Settings(model=model, prompt=prompt, drafter=drafter, tree=tree, budget=int(budget),
                    block_size=int(block_size), max_new_tokens=int(max_new_tokens),
                    device=device, dtype=dtype)


def init_widgets() -> None:
    """Widget defaults, set once per tab so that every page shows the same values."""
    ss = st.session_state
    ss.setdefault("drafter", "oracle")
    ss.setdefault("verify_tree", "tree")
    ss.setdefault("drafter_model", "")
    ss.setdefault("noise", 0.0)
    ss.setdefault("seed", 0)
    ss.setdefault("budget", DEFAULTS.budget)
    ss.setdefault("block_size", DEFAULTS.block_size)
    ss.setdefault("max_new_tokens", DEFAULTS.max_new_tokens)
    ss.setdefault("prompt_text", "")
