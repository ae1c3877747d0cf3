"""Drafters: who proposes the next L positions' log-probabilities each step. base.py is the lifecycle every
drafter follows; each drafter module declares its settings dataclass and a build function; registry.py maps a
name to them and holds DrafterSpec, the one typed description of a drafter and its settings."""
from engine.drafters.base import Drafter, DraftTarget
from engine.drafters.registry import REGISTRY, DrafterEntry, DrafterSpec, build_drafter

__all__ = ["REGISTRY", "DraftTarget", "Drafter", "DrafterEntry", "DrafterSpec", "build_drafter"]
