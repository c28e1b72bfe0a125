"""Where the adapters' tiny models are built: one cache for `policy.model: tiny:<name>` of every
adapter (vlm/tiny.py, diffusion/tiny.py), and building a model folder once, atomically.

The cache is `$MMRL_TINY_CACHE`, else `~/.cache/mmrl/tiny`; each adapter keeps one sub-folder per
model and build version in it. A model is written to a temporary sibling of its folder and renamed
into place, so a concurrent builder (another test process, another rank) never sees half of it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable

CACHE_ENV = "MMRL_TINY_CACHE"
DEFAULT_CACHE = os.path.join("~", ".cache", "mmrl", "tiny")


def cache_root() -> str:
    """The tiny-model cache folder: $MMRL_TINY_CACHE when set and non-empty, else ~/.cache/mmrl/tiny."""
    return os.environ.get(CACHE_ENV) or os.path.expanduser(DEFAULT_CACHE)


def build_once(folder: str, build: Callable[[str], None], complete: Callable[[str], bool], name: str) -> str:
    """`folder`, after `build(tmp)` has filled a temporary sibling that is then renamed to it, unless
    `complete(folder)` already holds (built before, or by a concurrent builder that won the rename)."""
    if complete(folder):
        return folder
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}-", dir=parent)
    try:
        build(tmp)
        if not complete(tmp):
            raise RuntimeError(f"building {name} into {tmp!r} left it incomplete: {sorted(os.listdir(tmp))}")
        try:
            os.rename(tmp, folder)
        except OSError:  # another process renamed its build into place first
            if not complete(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
