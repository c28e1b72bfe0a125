"""The zoom agent VLM of `configs/tiny/agent_zoom.yaml`: a tiny Qwen2.5-VL with a tokenizer over the words of
the zoom task's episodes, the `zoom` tool's announcement and its calls included.

Built offline, in code, with a fixed seed by the shapes world's recipe (`shapes_world.vlm_model.build`, with its
own corpus), then pretrained by `python -m shapes_world.pretrain_zoom` and
committed as `assets/tiny/zoom_agent`.
Images: every image (the 224x224 scene, and each zoomed quadrant) is shown at MODEL_SIDE x MODEL_SIDE
(policy.min_pixels = max_pixels = 112**2): 8x8 patches of 14 px merged 2x2 into 16 image tokens. The vision
tower has one block more than the shapes-world VLM's (3): telling a circle from a square took a 2-block tower of
this width far longer.
"""

from __future__ import annotations

import json

from shapes_world import vlm_model
from shapes_world.scene import SHAPES
from shapes_world.vlm_model import save  # noqa: F401  (the same save_pretrained layout)
from shapes_world.zoom import INSTRUCTIONS, QUADRANTS, question
from vlm import tiny

FORMAT_PROMPT = "{prompt} Reply as <answer> shape </answer>."
MODEL_SIDE = vlm_model.MODEL_SIDE      # 112
VOCAB_SIZE = 800
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]   # one token each, as in Qwen2.5


def zoom_call(region: str) -> str:
    """A reply that calls the zoom tool on `region`, in the hermes format (tools/formats.py)."""
    return "<tool_call>\n" + json.dumps({"name": "zoom", "arguments": {"region": region}}) + "\n</tool_call>"


def answer(kind: str) -> str:
    return f"<answer>{kind}</answer>"


def corpus() -> list[str]:
    """Every phrase an episode shows or the model writes (the BPE training text), the system message that
    announces the zoom tool (as the hermes format writes it) included."""
    from tools.box import build_tools, parse_tools
    from tools.formats import TOOL_FORMATS
    from vlm.turns import DEFAULT_SYSTEM

    schemas = [t.schema for t in build_tools(parse_tools(["zoom"]))]
    lines = ["system user assistant", TOOL_FORMATS.get("hermes").system_text(DEFAULT_SYSTEM, schemas),
             FORMAT_PROMPT.replace("{prompt}", ""), INSTRUCTIONS, "<tool_response>\n\n</tool_response>",
             "Your reply had no valid action."]
    lines += [question(q) for q in QUADRANTS] + [zoom_call(q) for q in QUADRANTS] + [answer(k) for k in SHAPES]
    return lines


def build(seed: int = 0):
    """(model, processor): a randomly initialised tiny Qwen2.5-VL (the shapes world's recipe, `vlm_model.build`,
    with a 3-block vision tower) over this corpus's tokenizer, with room for 1024 positions."""
    tok = tiny.qwen2_5_vl_tokenizer(corpus(), VOCAB_SIZE)
    tok.add_tokens(TOOL_TAGS + list(QUADRANTS))   # a region is one token: naming it is one choice, not three
    return vlm_model.build(seed, tok, max_positions=1024, vision={"depth": 3, "fullatt_block_indexes": [0, 1, 2]})
