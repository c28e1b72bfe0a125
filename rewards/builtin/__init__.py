"""Built-in rewards; importing this package registers them.

text:      format, math, choice, numeric, exact, contains, overlong
grounding: iou
image:     jpeg_compressibility, jpeg_incompressibility
clip:      clip_score, pickscore, hpsv2, aesthetic (factories; models load when built)
"""

from rewards.builtin import clip, grounding, image, text  # noqa: F401  (register on import)
from rewards.shapes import verify  # noqa: F401,E402  (shapes_t2i, shapes_vlm)
