"""Flat name -> object registries for the config boundary (STYLE.md rule 5)."""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T], dict):
    """A `dict` of name -> object whose failed look-up names the valid keys.

    Values may be lazy `"package.module:attribute"` strings, imported on first use, so
    the core can name adapters without importing them at module level.
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            self[name] = obj
            return obj

        return deco

    def get_item(self, name: str, field: str | None = None) -> T:
        if name not in self:
            where = f" (config key '{field}')" if field else ""
            raise KeyError(f"unknown {self.kind} {name!r}{where}; valid names: {', '.join(sorted(self))}")
        value = self[name]
        if isinstance(value, str):
            module, _, attr = value.partition(":")
            value = getattr(importlib.import_module(module), attr)
            self[name] = value
        return value

