"""Pluggable rewards: `Sample`, the registry, and the scorer that isolates failures."""

from rewards.registry import REGISTRY, register, registered, resolve
from rewards.sample import Sample

__all__ = ["REGISTRY", "Sample", "register", "registered", "resolve"]
