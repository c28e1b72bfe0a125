"""A bounded LRU cache of prompt conditioning, so a prompt seen again is not re-encoded.

The key is the prompt text alone, because everything else that shapes a prompt's `Cond` is fixed for
the life of the family that owns the encoders: `max_sequence_length`, device and dtype are family
options, and the negative prompt and the CFG scale never enter a prompt's `Cond` (the unconditional
`Cond` is encoded once, apart, as `family.uncond`). What could change is the text encoders' weights.
The adapter never trains them: `families.load` freezes them and `family.encode` runs without grad
(LoRA and full fine-tuning touch the denoiser only). A guard makes that an invariant rather than a
hope: the cache remembers the sum of the encoders' parameter version counters (torch bumps a tensor's
`_version` on every in-place write: an optimizer step, `load_state_dict`) and empties itself when it moves.

Exactness: a hit returns the very `Cond` the encoder produced, so it is bit for bit a fresh batch-1
encoding. Its tensors are shared by every rollout that used the prompt; writing into one in place
would corrupt them all, so each entry remembers its tensors' version counters and a hit on a modified
entry raises instead of handing the damage on.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable

import torch

from diffusion.families.common import Cond


def weights_version(modules: Iterable[torch.nn.Module]) -> int:
    """Sum of the parameters' in-place version counters: it grows whenever any weight is written."""
    return sum(p._version for m in modules for p in m.parameters())


def _versions(cond: Cond) -> tuple:
    return tuple(t._version for t in cond.tensors.values())


class TextCache:
    """`encode(prompt) -> Cond` behind an LRU of at most `size` prompts (0 = no cache, encode every time).

    `encoders`: the modules whose weights the conditioning depends on (checked once per `get`)."""

    def __init__(self, encode: Callable[[str], Cond], size: int, encoders: Iterable[torch.nn.Module] = ()):
        if size < 0:
            raise ValueError(f"a text cache holds >= 0 prompts (0 disables it), got {size}")
        self.encode, self.size, self.encoders = encode, size, list(encoders)
        self.entries: OrderedDict[str, tuple[Cond, tuple]] = OrderedDict()   # oldest use first
        self.version = weights_version(self.encoders)

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()

    def get(self, prompts: list[str]) -> dict[str, Cond]:
        """The `Cond` of each distinct prompt: from the cache, or encoded alone (batch 1) and cached."""
        version = weights_version(self.encoders)
        if version != self.version:                                   # the encoders changed: nothing cached holds
            self.entries.clear()
            self.version = version
        return {p: self._one(p) for p in dict.fromkeys(prompts)}

    def _one(self, prompt: str) -> Cond:
        hit = self.entries.get(prompt)
        if hit is not None:
            cond, versions = hit
            if _versions(cond) != versions:
                raise RuntimeError(f"the cached text embedding of prompt {prompt!r} was modified in place; "
                                   f"Cond tensors are shared by every rollout of the prompt: copy before writing")
            self.entries.move_to_end(prompt)
            return cond
        cond = self.encode(prompt)
        if self.size > 0:
            self.entries[prompt] = (cond, _versions(cond))
            if len(self.entries) > self.size:
                self.entries.popitem(last=False)                      # the least recently used
        return cond
