"""Step through a recorded run as engine.decoding.decoder.Decoder steps through a live one, with no model: each step()
hands out the next recorded StepRecord. The Decode page drives either through the same calls (steps, done, first_token,
step(), record())."""
from __future__ import annotations

import dataclasses

from engine.records import RunRecord, StepRecord


class Replay:
    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.steps: list[StepRecord] = []

    @property
    def first_token(self) -> int:
        return self.run.first_token

    @property
    def done(self) -> bool:
        return len(self.steps) == self.run.num_steps

    def step(self) -> StepRecord:
        if self.done:
            raise ValueError(f"the recorded {self.run.mode} run has no step after its last ({self.run.num_steps})")
        step = self.run.steps[len(self.steps)]
        self.steps.append(step)
        return step

    def record(self) -> RunRecord:
        """The run as far as it has been stepped: the recorded run once done, before that its first steps (and no
        text, which the report holds for the whole run only)."""
        if self.done:
            return self.run
        generated = [self.first_token] + [t for s in self.steps for t in s.committed]
        return dataclasses.replace(self.run, steps=list(self.steps), tokens=generated, text=None,
                                   wall_ns=self.run.prefill_ns + sum(s.wall_ns for s in self.steps))
