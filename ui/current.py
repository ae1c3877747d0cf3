"""The one decode every page of a tab shows: `Current` holds what was made of it (the Decode page's stepper, the
Measurement, its exports, a torch.profiler capture, a budget sweep, the drafter's health checks). `Live` is the
sidebar's settings, measured here on request; a recording (ui/recorded.py) is the other kind, read from a file.
The pages ask the current one and never which kind it is."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.decoding.request import DecodeRequest
from engine.decoding.session import make_decoder
from engine.model.target import TargetModel
from engine.timers import StepTimer
from profiling.measure import measure
from profiling.measurement import Measurement
from ui import resources
from ui.settings import Settings, checkpoint


def request_of(s: Settings) -> DecodeRequest:
    """The one place the sidebar's settings become a DecodeRequest."""
    return DecodeRequest(checkpoint(s.model), s.prompt, s.config, s.drafter, s.modes)


def target_model(s: Settings) -> TargetModel:
    return resources.target_model(s.model_id, checkpoint(s.model), s.config.device, s.config.dtype)


@dataclass(slots=True)
class Current:
    """What a tab made of its decode; dropped whole when the settings change. Each kind answers tokenizer(),
    start() (a prefilled stepper), reset(), stale(count) and needs_model()."""

    settings: Settings
    decoder: object | None = None  # the Decode page's stepper: a Decoder, or a recording's Replay
    measurement: Measurement | None = None  # AR and the modes, measured once (its repeats' count on the Profile page)
    reports: dict[str, bytes] | None = None  # the measurement's exports by file name, rendered once
    captured: Measurement | None = None  # a measurement under torch.profiler (Profile page)
    sweep: list[dict] | None = None  # the budget sweep's rows
    health: list | None = None  # profiling.drafter_health's checks

    def needs_model(self) -> str | None:
        """Why a control that decodes is disabled (None: it is not)."""
        return None


@dataclass(slots=True)
class Live(Current):
    """The sidebar's settings: decoded with the model on request."""

    def tokenizer(self):
        return checkpoint(self.settings.model).tokenizer

    def start(self):
        """A decoder of the stepped mode, prefilled."""
        request = request_of(self.settings)
        return make_decoder(request.checkpoint, request.prompt, request.config, request.primary, request.drafter,
                            timer=StepTimer(request.config.device), model=target_model(self.settings))

    def stale(self, count: int | None) -> bool:
        """Whether a measurement of `count` repeats (None: of any count) must be taken first."""
        kept = self.measurement
        return kept is None or (count is not None and kept.repeats.count != count)

    def measure(self, count: int | None, on_progress: Callable[[int, int], None] | None = None) -> None:
        """Measure `count` repeats (None: one) after one warm-up; its exports are rendered again when asked."""
        s = self.settings
        self.keep(measure(request_of(s), target_model(s), repeats=count or 1, on_progress=on_progress))

    def keep(self, measurement: Measurement) -> None:
        """Adopt a measurement of these settings (taken here or by the Profile page's job); its exports are
        rendered again when asked."""
        self.measurement, self.reports = measurement, None

    def forget(self) -> None:
        """Drop the measurement, so the next page view measures again."""
        self.measurement = self.reports = None

    def reset(self) -> None:
        self.decoder = None
