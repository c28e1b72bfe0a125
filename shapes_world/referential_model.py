"""The speaker and listener VLMs of `configs/tiny/referential_game.yaml`: two tiny Qwen2.5-VLs (the shapes world's
recipe, `shapes_world.vlm_model.build`, with their own seeds) over one tokenizer of the referential game's words.

Built offline, in code, then pretrained together by `python -m shapes_world.pretrain_referential` and committed as
`assets/tiny/referential_speaker` and `assets/tiny/referential_listener`.
Images: the speaker's target panel (56 x 56) is shown at 56 x 56 (policy.min_pixels = max_pixels = 56**2: four
image tokens); the listener's K panels side by side (56K x 56) at 28K x 28, one image token per panel.
"""

from __future__ import annotations

from shapes_world import vlm_model
from shapes_world.referential import INSTRUCTIONS, listener_text
from shapes_world.scene import COLORS, SHAPES
from shapes_world.vlm_model import save  # noqa: F401  (the same save_pretrained layout)
from vlm import tiny

SPEAKER_FORMAT = "{prompt}"                                   # the speaker's whole reply is its message
LISTENER_FORMAT = "{prompt} Reply as <answer> number </answer>."
VAGUE = "a shape"                                             # the message that says nothing of the target
VOCAB_SIZE = 400
SPEAKER_PIXELS = 56 * 56
LISTENER_PIXELS = 28 * 28 * 4


def answer(n: int) -> str:
    return f"<answer>{n}</answer>"


def corpus() -> list[str]:
    """Every phrase a round shows or the models write (the BPE training text)."""
    lines = ["system user assistant You are a helpful assistant.", "The target:", VAGUE, "(nothing)",
             LISTENER_FORMAT.replace("{prompt}", "")] + list(INSTRUCTIONS.values())
    for k in range(2, 5):
        lines += [listener_text(m, k) for m in [*COLORS, VAGUE]]
    lines += [answer(n) for n in range(1, 7)] + [f"{c} {s}" for c in COLORS for s in SHAPES]
    return lines


def build(seed: int = 0, layers: int = 2):
    """(model, processor): a randomly initialised tiny Qwen2.5-VL over the game's tokenizer, each colour one token,
    with `layers` language model layers."""
    tok = tiny.qwen2_5_vl_tokenizer(corpus(), VOCAB_SIZE)
    missing = [c for c in COLORS if len(tok(" " + c, add_special_tokens=False).input_ids) != 1]
    tok.add_tokens(missing)
    return vlm_model.build(seed, tok, max_positions=512, vision={"depth": 3, "fullatt_block_indexes": [0, 1, 2]},
                           text={"num_hidden_layers": layers})
