"""Pluggable rewards: `Sample`, the registry, and the scorer that isolates failures."""

from rewards.registry import REGISTRY, register, registered, resolve
from rewards.sample import Sample, Video

__all__ = ["REGISTRY", "Sample", "Video", "register", "registered", "resolve"]
