"""The shared sidebar: which model, prompt, drafter and decode configuration every page works with."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import streamlit as st
import torch

from engine.config import DTYPES, MAX_BLOCK_SIZE, MAX_BUDGET, MAX_TEMPERATURE, MIN_BLOCK_SIZE, DecodeConfig
from engine.drafters import REGISTRY, DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.dflash_checkpoint import dflash_dir_beside, read_dflash_dir
from engine.loaders.dflash_fit import block_size_note, check_fits
from engine.loaders.shipped import bundled_models
from engine.records import TREES
from ui import prompt as prompt_input
from ui import resources
from ui.safe_text import plain

DEFAULTS = DecodeConfig()
PROFILE_REPEATS = 5  # the Profile page's default number of measured repeats
TREE_LABELS = {"tree": "DDTree", "chain": "chain", "both": "chain and DDTree"}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a decode depends on; any change starts the decode over."""

    model: str
    model_id: str  # the checkpoint's identity (resources.identity): a replaced file is another model
    prompt: tuple[int, ...]
    drafter: DrafterSpec
    tree: str  # an engine.records.TREES key: which speculative modes run beside AR
    budget: int
    block_size: int
    max_new_tokens: int
    device: str
    dtype: str
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    batch_invariant: bool = False

    def decode_config(self) -> DecodeConfig:
        return DecodeConfig(budget=self.budget, block_size=self.block_size, max_new_tokens=self.max_new_tokens,
                            device=self.device, dtype=self.dtype, temperature=self.temperature, top_k=self.top_k,
                            top_p=self.top_p, seed=self.seed, batch_invariant=self.batch_invariant)

    @property
    def modes(self) -> tuple[str, ...]:
        return TREES[self.tree]

    @property
    def stepped_mode(self) -> str:
        """The mode the Decode page steps through: DDTree when it runs, else the chain."""
        return self.modes[-1]


def devices() -> list[str]:
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def model_id(model: str) -> str:
    """The identity of the checkpoint behind a sidebar model name (resources.identity; an upload's content
    hash): the key of the model caches."""
    ids = st.session_state.model_ids
    return ids[model] if model in ids else resources.identity(bundled_models()[model])


def checkpoint(model: str) -> Checkpoint:
    """The checkpoint behind a sidebar model name: a shipped model or this tab's upload or path."""
    uploads = st.session_state.uploads
    if model in uploads:
        return uploads[model]
    return resources.bundled_checkpoint(str(bundled_models()[model]), model_id(model))


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
        ss.upload_error = f"{file.name} was not loaded: {_sentence(exc)}"
        return
    ss.model_ids[name] = f"upload:{name}"
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
        ss.model_ids[path] = resources.identity(path)
    except (ValueError, OSError) as exc:
        ss.upload_error = f"{path} was not loaded: {_sentence(exc)}"
        return
    ss.model = path


def _sentence(exc: Exception) -> str:
    """An error message ending with a full stop, so that what follows reads as the next sentence."""
    text = str(exc).rstrip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _model() -> str:
    st.header("Model")
    names = [*bundled_models(), *st.session_state.uploads]
    model = st.selectbox("Checkpoint", names, key="model",
                         help="The models under models/ (the first is the default), the fixtures in tests/refs, "
                              "then your uploads and paths.")
    st.file_uploader("Upload a .kdtr", type=["kdtr"], key="upload", on_change=_on_upload,
                     help="Validated by the same loader as the CLI (engine.loaders.kdtr.read_kdtr).")
    st.text_input("Or load a path", key="model_path", on_change=_on_path,
                  placeholder="model.kdtr or a Hugging Face directory",
                  help="A .kdtr file or a Hugging Face DeepSeek-V3 / Kimi-K2 directory (config.json + safetensors) "
                       "on this server, loaded by engine.loaders.loading.load_model, as `run --model` does.")
    if st.session_state.upload_error:
        st.error(plain(f"{st.session_state.upload_error} Still using {model}."))
    return model


def _drafter() -> DrafterSpec | None:
    """The drafter and the settings its registry entry reads; None (with the error shown) while they are bad. A
    drafter checkpoint box left empty, or still holding the last directory filled in for another target, is
    filled with the DFlash directory beside the target (engine.loaders.dflash_checkpoint.dflash_dir_beside), if it has one. A
    checkpoint is checked as it is typed: the loader's and the fit's errors show here, and decoding waits."""
    st.header("Drafter")
    ss = st.session_state
    target = checkpoint(ss.model)
    if ss.get("drafter_for") != ss.model:  # a new target: its own drafter beside it, else the oracle
        ss.drafter_for = ss.model
        ss.drafter = "dflash" if dflash_dir_beside(target.source) is not None else "oracle"
        ss.drafter_model = ""
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
                st.warning(plain(f"Drafter: {note}."))
    except ValueError as exc:
        st.error(plain(f"Drafter: {exc}"))
        return None
    return spec


def max_new_tokens_range(ckpt: Checkpoint, prompt_len: int, block_size: int) -> tuple[int, int]:
    """What max new tokens may be: at least 1, at most what the model's context holds after the prompt and one
    block (engine.decoding.decoder.check_room's rule)."""
    return 1, ckpt.config.max_position_embeddings - prompt_len - block_size


def _sampling() -> dict:
    st.header("Sampling")
    temperature = st.number_input("Temperature", 0.0, MAX_TEMPERATURE, step=0.1, key="temperature",
                                  help="0 is greedy: every mode must emit exactly the AR tokens. Above 0 the target "
                                       "samples, keyed by the seed and the position, so AR and DDTree still agree.")
    sampled = temperature > 0
    top_k = st.number_input("Top-k", 0, None, step=1, key="top_k", disabled=not sampled,
                            help="Sample among the k most likely tokens; 0 keeps them all.")
    top_p = st.number_input("Top-p", 0.01, 1.0, step=0.05, key="top_p", disabled=not sampled,
                            help="Sample within the smallest set of tokens holding this much probability.")
    seed = st.number_input("Sampling seed", 0, None, step=1, key="sample_seed", disabled=not sampled)
    batch_invariant = st.toggle("Batch-invariant", key="batch_invariant",
                                help="Compute every verify row as AR computes it (slower): DDTree's tokens then "
                                     "equal AR's bit for bit, with no numerics near ties.")
    return {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p), "seed": int(seed),
            "batch_invariant": bool(batch_invariant)}


def sidebar() -> tuple[Settings | None, list[str]]:
    """Draw the sidebar; returns the chosen settings (None while an input is invalid) and the names of the
    invalid inputs."""
    with st.sidebar:
        model = _model()
        ckpt = checkpoint(model)
        prompt = prompt_input.widget(model, ckpt)
        drafter = _drafter()
        st.header("Decode")
        tree = st.radio("Verify", list(TREES), key="verify_tree", horizontal=True, format_func=TREE_LABELS.get,
                        help="The best-first tree (DDTree), the drafter's top-1 chain (DFlash's own verification), "
                             "or both beside AR on the Profile, Compare and Report pages.")
        budget = st.number_input("Budget B (tree nodes)", 0, MAX_BUDGET, step=1, key="budget",
                                 help="Drafted nodes per step, root excluded; 0 is plain AR.")
        block_size = st.number_input("Block size", MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, step=1, key="block_size",
                                     help="The drafter proposes block_size - 1 positions per step.")
        lo, hi = max_new_tokens_range(ckpt, len(prompt or ()), int(block_size))
        max_new_tokens = st.number_input("Max new tokens", 1, ckpt.config.max_position_embeddings, step=1,
                                         key="max_new_tokens",
                                         help=f"{lo} to {hi} here: the model's context of "
                                              f"{ckpt.config.max_position_embeddings} positions holds the prompt, "
                                              "the generated tokens and one block.")
        fits = lo <= max_new_tokens <= hi
        if not fits:
            st.error(f"Max new tokens: {max_new_tokens} is out of range: expected {lo} to {hi} (the context of "
                     f"{ckpt.config.max_position_embeddings} positions minus the prompt's {len(prompt or ())} tokens "
                     f"and block size {block_size})" if hi >= lo else
                     f"Max new tokens: the prompt's {len(prompt or ())} tokens and block size {block_size} leave "
                     f"no room in the model's context of {ckpt.config.max_position_embeddings} positions: "
                     "shorten the prompt")
        device = st.selectbox("Device", devices(), key="device", help="cuda is offered when torch sees a GPU.")
        dtype = st.selectbox("Dtype", list(DTYPES), key="dtype")
        sampling = _sampling()
    invalid = [name for name, bad in (("prompt", prompt is None), ("drafter", drafter is None),
                                      ("max new tokens", prompt is not None and not fits)) if bad]
    if invalid:
        return None, invalid
    return Settings(model=model, model_id=model_id(model), prompt=prompt, drafter=drafter, tree=tree,
                    budget=int(budget), block_size=int(block_size), max_new_tokens=int(max_new_tokens),
                    device=device, dtype=dtype, **sampling), []


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
    ss.setdefault("temperature", DEFAULTS.temperature)
    ss.setdefault("top_k", DEFAULTS.top_k)
    ss.setdefault("top_p", DEFAULTS.top_p)
    ss.setdefault("sample_seed", DEFAULTS.seed)
    ss.setdefault("batch_invariant", DEFAULTS.batch_invariant)
    ss.setdefault("profile_repeats", PROFILE_REPEATS)
