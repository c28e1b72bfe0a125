"""Built-in rewards; importing this package registers them.

text:      format, math, choice, numeric, exact, contains, overlong
grounding: iou
image:     jpeg_compressibility, jpeg_incompressibility
video:     per_frame (an image reward lifted to a video's frames, mean or min)
           temporal_clip, temporal_warp (consecutive frames alike: CLIP cosine, optical-flow warp error)
clip:      clip_score, pickscore, hpsv2, aesthetic (factories; models load when built)
episode:   env_return, env_success (multi-turn agents)
judge:     judge (a vision-language model asked a rubric question; rewards/judge.py)
remote:    remote (a reward served by `mmrl rewards serve`; needs the `serve` extra)
"""

from rewards.builtin import clip, episode, grounding, image, remote, text, video  # noqa: F401  (register on import)
from rewards.shapes import motion, quality, verify  # noqa: F401,E402  (shapes_t2i, shapes_vlm, shapes_stray, shapes_motion)
from rewards import judge  # noqa: F401,E402  (judge)
