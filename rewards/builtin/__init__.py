"""Built-in rewards; importing this package registers them.

text:      format, math, choice, numeric, exact, contains, overlong
grounding: iou
image:     jpeg_compressibility, jpeg_incompressibility
clip:      clip_score, pickscore, hpsv2, aesthetic (factories; models load when built)
"""

from rewards.builtin import clip, grounding, image, text  # noqa: F401  (register on import)
