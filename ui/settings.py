"""The shared sidebar: which model, prompt, drafter and decode configuration every page works with."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import streamlit as st
import torch

from engine.config import DECODE, DEVICES, SAMPLING, DecodeConfig, batch_invariant_default
from engine.drafters import REGISTRY, DrafterSpec
from engine.drafters.dflash import DFlashSettings
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.dflash_checkpoint import dflash_dir_beside, read_dflash_dir
from engine.loaders.dflash_fit import block_size_note, check_fits
from engine.loaders.shipped import bundled_models
from engine.records import TREES
from engine.settings import ConfigError, Option, options_of
from ui import prompt as prompt_input
from ui import resources, setting_widgets
from ui.safe_text import plain

PROFILE_REPEATS = 5  # the Profile page's default number of measured repeats
TREE_LABELS = {"tree": "DDTree", "chain": "chain", "both": "chain and DDTree"}
LABELS = {"model": "Checkpoint", "prompt": prompt_input.LABELS["prompt_source"], "drafter": "Drafter",
          "tree": "Verify"}  # the sidebar's labels of Settings' fields (a DecodeConfig field's is its Setting's)
LOCKED = ("A recording is shown: the settings below are the live decode's, locked until you close the recording "
          "(its own settings are in the banner above the page).")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a decode depends on; any change starts the decode over. The decode configuration is one
    DecodeConfig (its fields are described there once: the sidebar, the CLI and the URL read that description)."""

    model: str
    model_id: str  # the checkpoint's identity (resources.identity): a replaced file is another model
    prompt: tuple[int, ...]
    drafter: DrafterSpec
    tree: str  # an engine.records.TREES key: which speculative modes run beside AR
    config: DecodeConfig

    def __post_init__(self) -> None:
        if self.tree not in TREES:
            raise ValueError(f"tree={self.tree!r:.40}: expected one of {', '.join(TREES)}")
        if not isinstance(self.config, DecodeConfig):
            raise TypeError(f"config: expected a DecodeConfig, got {type(self.config).__name__}")

    @property
    def modes(self) -> tuple[str, ...]:
        return TREES[self.tree]

    @property
    def stepped_mode(self) -> str:
        """The mode the Decode page steps through: DDTree when it runs, else the chain."""
        return self.modes[-1]


def devices() -> list[str]:
    return list(DEVICES) if torch.cuda.is_available() else ["cpu"]


def offered(opt: Option, ckpt: Checkpoint) -> tuple[Option, str]:
    """opt as the sidebar offers it for this model on this machine (setting_widgets.narrowed: max new tokens up to
    the model's context, the devices torch sees, integers the browser holds), and why that is less than its Setting
    holds ("" when it is not). A link's values are checked against it, so no widget replaces one silently."""
    if opt.key == "max_new_tokens":
        positions = ckpt.config.max_position_embeddings
        shown, why = setting_widgets.narrowed(opt, hi=positions), f"the model's context holds {positions} positions"
    elif opt.key == "device":
        shown, why = setting_widgets.narrowed(opt, choices=devices()), "torch sees no GPU on this server"
    else:
        shown, why = setting_widgets.narrowed(opt), "the largest integer a browser holds exactly"
    return shown, "" if shown is opt else why


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


def _model(locked: bool) -> str:
    st.header("Model")
    names = [*bundled_models(), *st.session_state.uploads]
    model = st.selectbox(LABELS["model"], names, key="model", disabled=locked,
                         help="The models under models/ (the trained pair first, the default; then the .kdtr "
                              "fixtures there), then your uploads and paths.")
    st.file_uploader("Upload a .kdtr", type=["kdtr"], key="upload", on_change=_on_upload, disabled=locked,
                     help="Validated by the same loader as the CLI (engine.loaders.kdtr.read_kdtr).")
    st.text_input("Or load a path", key="model_path", on_change=_on_path, disabled=locked,
                  placeholder="model.kdtr or a Hugging Face directory",
                  help="A .kdtr file or a Hugging Face DeepSeek-V3 / Kimi-K2 directory (config.json + safetensors) "
                       "on this server, loaded by engine.loaders.loading.load_model, as `run --model` does.")
    if st.session_state.upload_error:
        st.error(plain(f"{st.session_state.upload_error} Still using {model}."))
    return model


def _drafter(target: Checkpoint, locked: bool) -> DrafterSpec | None:
    """The drafter and its settings' widgets (from its settings dataclass); None (with the error shown) while they
    are bad. A drafter checkpoint box left empty, or still holding the last directory filled in for another
    target, is filled with the DFlash directory beside the target (engine.loaders.dflash_checkpoint.dflash_dir_beside),
    if it has one. A checkpoint is checked as it is typed: the loader's and the fit's errors show here, and
    decoding waits. The block size follows the drafter (_follow_block_size)."""
    st.header("Drafter")
    ss = st.session_state
    if ss.get("drafter_for") != ss.model:  # a new target: its own drafter beside it, else the oracle
        ss.drafter_for = ss.model
        ss.drafter = "dflash" if dflash_dir_beside(target.source) is not None else "oracle"
        ss.drafter_model = ""
    name = st.selectbox(LABELS["drafter"], list(REGISTRY), key="drafter", help=REGISTRY[ss.drafter].summary,
                        disabled=locked)
    settings = REGISTRY[name].settings
    if settings is DFlashSettings and ss.drafter_model in ("", ss.get("drafter_model_filled")):
        beside = dflash_dir_beside(target.source)
        ss.drafter_model = ss.drafter_model_filled = "" if beside is None else str(beside)
    values = {opt.name: setting_widgets.draw(offered(opt, target)[0], disabled=locked) for opt in options_of(settings)}
    try:
        spec = DrafterSpec(name, **values)
        drafter = read_dflash_dir(spec.model) if isinstance(spec.options, DFlashSettings) else None
        if drafter is not None:
            check_fits(drafter.config, target.config, drafter.source)
        _follow_block_size(spec)
    except ValueError as exc:
        st.error(plain(f"Drafter: {exc}"))
        return None
    note = None if drafter is None else block_size_note(drafter.config, ss.block_size)
    if note is not None:
        st.warning(plain(f"Drafter: {note}."))
    return spec


def _follow_block_size(spec: DrafterSpec) -> None:
    """Before the block size widget is drawn (Streamlit refuses a widget's value set after it): when the drafter, or
    the settings of one trained at a block size (a DFlash checkpoint directory), differ from those the block size was
    set for, it takes the drafter's own (DrafterSpec.default_block_size, as the CLI's --block-size left out); one set
    by hand, or by a link (given_block_size), for the same drafter stays."""
    ss = st.session_state
    owner = spec if REGISTRY[spec.name].trained_block_size else spec.name  # the oracle's noise leaves it alone
    if ss.get("block_size_for") != owner:
        if not ss.pop("block_size_given", False):
            ss.block_size = spec.default_block_size()
        ss.block_size_for = owner


def given_block_size() -> None:
    """The block size was given before the first sidebar (a link): the drafter drawn next keeps it."""
    st.session_state.block_size_given = True


def max_new_tokens_range(ckpt: Checkpoint, prompt_len: int, block_size: int) -> tuple[int, int]:
    """What max new tokens may be: at least 1, at most what the model's context holds after the prompt and one
    block (engine.decoding.decoder.check_room's rule)."""
    return 1, ckpt.config.max_position_embeddings - prompt_len - block_size


def _decode(ckpt: Checkpoint, prompt_len: int, locked: bool) -> tuple[dict, bool]:
    """The Decode section's DecodeConfig fields (max new tokens bounded by the model's context, the devices this
    machine has); whether max new tokens fits after the prompt."""
    values = {}
    positions = ckpt.config.max_position_embeddings
    for opt in (o for o in options_of(DecodeConfig) if o.setting.section == DECODE):
        extra = ""
        if opt.name == "max_new_tokens":  # drawn after the block size, which its room depends on
            lo, hi = max_new_tokens_range(ckpt, prompt_len, values["block_size"])
            extra = (f"{lo} to {hi} here: the model's context of {positions} positions holds the prompt, the generated "
                     "tokens and one block.")
        values[opt.name] = setting_widgets.draw(offered(opt, ckpt)[0], disabled=locked, extra=extra)
    max_new_tokens, block_size = values["max_new_tokens"], values["block_size"]
    fits = lo <= max_new_tokens <= hi
    if not fits:
        st.error(f"Max new tokens: {max_new_tokens} is out of range: expected {lo} to {hi} (the context of "
                 f"{positions} positions minus the prompt's {prompt_len} tokens and block size {block_size})"
                 if hi >= lo else
                 f"Max new tokens: the prompt's {prompt_len} tokens and block size {block_size} leave no room in "
                 f"the model's context of {positions} positions: shorten the prompt")
    return values, fits


def _follow_device() -> None:
    """Before the batch-invariant toggle is drawn (after the device select): when the device differs from the one
    the toggle was set for, it takes that device's default (engine.config.batch_invariant_default, as the CLI's flag
    left out); one set by hand, or by a link, for the same device stays."""
    ss = st.session_state
    if ss.get("batch_invariant_for") != ss.device:
        if not ss.pop("batch_invariant_given", False):
            ss.batch_invariant = batch_invariant_default(ss.device)
        ss.batch_invariant_for = ss.device


def given_batch_invariant() -> None:
    """The batch-invariant toggle was given before the first sidebar (a link): the device drawn next keeps it."""
    st.session_state.batch_invariant_given = True


def _sampling(ckpt: Checkpoint, locked: bool) -> dict:
    """The Sampling section's fields; those that only matter when sampling are disabled at temperature 0."""
    st.header("Sampling")
    _follow_device()
    values = {}
    for opt in (o for o in options_of(DecodeConfig) if o.setting.section == SAMPLING):
        greedy = values.get("temperature", st.session_state.temperature) == 0
        values[opt.name] = setting_widgets.draw(offered(opt, ckpt)[0],
                                                disabled=locked or (opt.setting.sampling_only and greedy))
    return values


def sidebar() -> tuple[Settings | None, list[str]]:
    """Draw the sidebar; returns the chosen settings (None while an input is invalid) and the names of the
    invalid inputs. While a recording is shown the live settings are drawn disabled: what the pages show is the
    recording's, and a change would reset a live decode out of sight; they are back as they were once it closes."""
    locked = st.session_state.get("recording") is not None
    with st.sidebar:
        if locked:
            st.caption(LOCKED)
        model = _model(locked)
        ckpt = checkpoint(model)
        prompt = prompt_input.widget(model, ckpt, locked)
        drafter = _drafter(ckpt, locked)
        st.header("Decode")
        tree = st.radio(LABELS["tree"], list(TREES), key="verify_tree", horizontal=True, format_func=TREE_LABELS.get,
                        disabled=locked,
                        help="The best-first tree (DDTree), the drafter's top-1 chain (DFlash's own verification), "
                             "or both beside AR on the Profile, Compare and Report pages.")
        decode, fits = _decode(ckpt, len(prompt or ()), locked)
        decode |= _sampling(ckpt, locked)
        try:
            config = DecodeConfig(**decode)
        except ConfigError as exc:  # a combination no single widget can refuse (auto budget at B = 0)
            st.error(plain(f"Decode: {exc}"))
            config = None
    invalid = [name for name, bad in (("prompt", prompt is None), ("drafter", drafter is None),
                                      ("max new tokens", prompt is not None and not fits),
                                      ("decode configuration", config is None)) if bad]
    if invalid:
        return None, invalid
    return Settings(model=model, model_id=model_id(model), prompt=prompt, drafter=drafter, tree=tree,
                    config=config), []


def init_widgets() -> None:
    """Widget defaults, set once per tab so that every page shows the same values: each setting's default (a text
    box that is not given, empty)."""
    ss = st.session_state
    ss.setdefault("drafter", "oracle")
    ss.setdefault("verify_tree", "tree")
    ss.setdefault("prompt_text", "")
    for opt in setting_options():
        ss.setdefault(opt.key, "" if opt.default is None else opt.default)
    ss.batch_invariant = ss.batch_invariant if isinstance(ss.batch_invariant, bool) else \
        batch_invariant_default(ss.device)  # not given: the device's (a toggle holds a bool)
    ss.setdefault("profile_repeats", PROFILE_REPEATS)


def setting_options() -> list[Option]:
    """Every option the sidebar draws under its own key: each drafter's settings (a key two drafters share once),
    then DecodeConfig's."""
    options = {opt.key: opt for entry in REGISTRY.values() for opt in options_of(entry.settings)}
    return [*options.values(), *options_of(DecodeConfig)]
