"""Tool name -> function: the built-ins, and user references 'module:fn' / 'path/to/file.py:fn' (`tools.function`)."""

from __future__ import annotations

from rewards.lookup import Registry

TOOLS: Registry = Registry("tool", references=True)
TOOLS.update({
    "zoom": "tools.visual:zoom",      # a named region of the observation image, shown at the whole image's size
    "crop": "tools.visual:crop",      # a pixel box of the observation image, shown at the whole image's size
    "python": "tools.sandbox:python",  # the model's Python code in a sandboxed interpreter (tools/sandbox.py)
})
