"""Drafters: who proposes the next L positions' log-probabilities each step. base.py is the lifecycle every
drafter follows; registry.py maps a name to a drafter and holds DrafterSpec, the one typed description of a
drafter and its settings."""
from engine.drafters.base import Drafter, DraftTarget
from engine.drafters.registry import REGISTRY, DrafterSpec, build_drafter

__all__ = ["REGISTRY", "DraftTarget", "Drafter", "DrafterSpec", "build_drafter"]
