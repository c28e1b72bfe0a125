"""Token segments of a multi-turn conversation, built once and concatenated (never re-rendered).

A trajectory's token sequence is the concatenation of its segments:

    head   = chat template of [system?, user: instructions + first observation] + generation prompt
    reply  = the sampled tokens, exactly as generated (the model's actions)
    turn   = what closes the reply (the template's tail after the end-of-turn token) + the chat
             template of the next user message (feedback + observation) + generation prompt

Re-rendering the whole conversation with the chat template and re-tokenising it can change the
model's tokens (the multi-turn retokenisation drift veRL and SGLang avoid with token-in-token-out);
concatenating segments keeps every generated token as it was sampled, so the context a reply was
generated from is exactly a prefix of the sequence it is scored in. The `turn` text is taken from the
template itself: render [user, assistant, user] and [user, assistant] and keep the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from PIL import Image

from vlm.features import encode
from vlm.images import ResizePolicy, resize, to_rgb
from vlm.prompts import InputKeys, build_messages, split_encoding

_MARK_A, _MARK_B = "mmrl-user-mark", "mmrl-reply-mark"
DEFAULT_SYSTEM = "You are a helpful assistant."   # the system text tools are announced after when none is set


@dataclass(eq=False)
class Segment:
    """A run of tokens of a trajectory: context (template, observation) or the model's reply.

    input_ids:      [l] token ids.
    token_inputs:   per-token model inputs, each [l] (e.g. mm_token_type_ids).
    image_inputs:   per-image model inputs, each [n_img, ...] (e.g. image_grid_thw).
    encoder_inputs: vision-encoder inputs of this segment's images (dropped once encoded when the vision side is frozen).
    features:       the encoder output of its images, computed once when the segment was built (no grad).
    """

    input_ids: torch.Tensor
    token_inputs: dict = field(default_factory=dict)
    image_inputs: dict = field(default_factory=dict)
    encoder_inputs: dict = field(default_factory=dict)
    features: object = None
    images: list = field(default_factory=list)
    text: str = ""
    action: bool = False


def reply_segment(tokens: torch.Tensor) -> Segment:
    """The model's sampled tokens [l] (trained actions)."""
    return Segment(input_ids=tokens.long(), action=True)


def as_image(obs_image) -> Image.Image:
    """An observation image (PIL or an HxWx3 uint8 array) as an RGB PIL image."""
    if isinstance(obs_image, Image.Image):
        return to_rgb(obs_image)
    try:
        return Image.fromarray(obs_image).convert("RGB")
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"an observation's 'image' must be a PIL image or an HxWx3 uint8 array, got "
                         f"{type(obs_image).__name__} ({e})") from None


class TurnTemplate:
    """Builds the `head` and `turn` segments of a conversation with one processor (module docstring)."""

    def __init__(self, processor, keys: InputKeys, resize_policy: ResizePolicy, image_kwargs: dict,
                 eos_text: str, hf=None, device=None, keep_encoder_inputs: bool = False):
        self.processor, self.keys, self.resize, self.image_kwargs = processor, keys, resize_policy, image_kwargs
        self.eos_text, self.hf, self.device, self.keep_encoder_inputs = eos_text, hf, device, keep_encoder_inputs
        self._base = [_user([], _MARK_A), {"role": "assistant", "content": [{"type": "text", "text": _MARK_B}]}]
        self._closed = self._render(self._base, False)                   # ends with the reply's closing text
        after_reply = self._closed[self._closed.index(_MARK_B) + len(_MARK_B):]      # e.g. "<|im_end|>\n"
        if not after_reply.startswith(eos_text):
            raise ValueError(f"the chat template closes an assistant message with {after_reply!r}, not with the "
                             f"end-of-turn token {eos_text!r} generation stops at; multi-turn episodes need both")
        self.tail = after_reply[len(eos_text):]                            # what follows the end-of-turn token
        self.turn_text("")                                                 # fail early on a template that cannot
        self.tool_format, self.tool_schemas, self.native_tools = None, [], False     # `use_tools`

    def _render(self, messages: list, generation_prompt: bool, tools: list | None = None) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.processor.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False,
                                                  **kwargs)

    def use_tools(self, fmt, schemas: list[dict]) -> None:
        """Announce `schemas` in every head and render tool results: with the template's own `tools=` and
        `role: tool` rendering when it has one (it renders something different when given tools), else with
        the format's text (`tools.formats`)."""
        probe = [_user([], "x")]
        self.tool_format, self.tool_schemas = fmt, list(schemas)
        self.native_tools = self._render(probe, True, self.tool_schemas) != self._render(probe, True)

    def _continuation(self, messages: list) -> str:
        """The template's text of `messages` and the generation prompt, as they follow a closed assistant message."""
        longer = self._render(self._base + messages, True)
        if not longer.startswith(self._closed):
            raise ValueError("the processor's chat template does not render a conversation as a prefix of its "
                             "continuation; multi-turn episodes need one that does (as Qwen-VL's and LLaVA's do)")
        return longer[len(self._closed):]

    def turn_text(self, text: str, n_images: int = 0) -> str:
        """The template's text of a next user message (images, then `text`) and the generation prompt,
        as it follows a closed assistant message."""
        return self._continuation([_user([{"type": "image"}] * n_images, text)])

    def head(self, system: str | None, text: str, image, features=None) -> Segment:
        """System prompt, the first user message (image first, then text) and the generation prompt;
        `features`: the image's encoder output when it was already encoded (else it is encoded now).
        With tools (`use_tools`) the system message announces them."""
        images = [self._image(image)] if image is not None else []
        schemas = self.tool_schemas
        if schemas and not self.native_tools:
            system = self.tool_format.system_text(system or DEFAULT_SYSTEM, schemas)
        messages = build_messages(text, len(images), system)
        if schemas and self.native_tools and system:
            messages[0] = {"role": "system", "content": system}      # templates with tools= read a string
        rendered = self._render(messages, True, schemas if schemas and self.native_tools else None)
        return self._segment(rendered, images, text, special=True, features=features)

    def tool_turn(self, results: list, reply_ended: bool) -> Segment:
        """Close the reply that called tools, then the calls' results (`tools.ToolResult`: text, images) as the
        template renders `role: tool` messages (or as the format writes them for a template without tools),
        and the generation prompt. Each result's images come before its text and are encoded once, here."""
        images = [self._image(im) for r in results for im in r.images]
        if self.native_tools:
            messages = [{"role": "tool", "content": [{"type": "image"} for _ in r.images] + [{"type": "text", "text": r.text}]
                         if r.images else r.text} for r in results]
        else:
            messages = [{"role": "user", "content": self.tool_format.result_parts([(r.text, r.images) for r in results])}]
        closing = self.tail if reply_ended else self.eos_text + self.tail
        shown = "\n".join(r.text for r in results)
        return self._segment(closing + self._continuation(messages), images, shown, special=False)

    def turn(self, text: str, image, reply_ended: bool) -> Segment:
        """Close the previous reply (with the end-of-turn token too when generation stopped at max_new_tokens),
        then the next user message (image, then text) and the generation prompt."""
        images = [self._image(image)] if image is not None else []
        closing = self.tail if reply_ended else self.eos_text + self.tail
        return self._segment(closing + self.turn_text(text, len(images)), images, text, special=False)

    def _image(self, image) -> Image.Image:
        return resize(as_image(image), self.resize)[0]

    def _segment(self, text: str, images: list, shown: str, special: bool, features=None) -> Segment:
        kwargs = dict(self.image_kwargs) if images else {}
        if not special:
            kwargs["add_special_tokens"] = False          # a continuation: no BOS in the middle of a sequence
        enc = self.processor(text=[text], images=images or None, return_tensors="pt", **kwargs)
        ids, token, image, encoder = split_encoding(enc, self.keys)
        seg = Segment(ids, token, image, encoder if images else {}, images=images, text=shown, features=features)
        if images and self.hf is not None and features is None:
            with torch.no_grad():
                seg.features = encode(self.hf, seg.encoder_inputs, self.device)
        if seg.features is not None and not self.keep_encoder_inputs:
            seg.encoder_inputs = {}                       # pixels are not needed again
        return seg


def _user(parts: list, text: str) -> dict:
    return {"role": "user", "content": parts + [{"type": "text", "text": text}]}
