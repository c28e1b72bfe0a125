"""Records -> model-ready prompts through the processor's chat template.

One record becomes a `PromptInputs`: prompt token ids, the processor's other outputs sorted
by who consumes them (the vision encoder, the language model per token, the language model
per image), the resized images and their resize records. Images are placed where the text
has `<image>` marks, else before the text (the layout Qwen-VL, LLaVA and Idefics3 document).

Truncation (`policy.truncation`) never removes image placeholder or other special tokens:
`left` drops the earliest plain text tokens, `error` refuses prompts over
`policy.max_prompt_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mmrl.config import ConfigError
from vlm.converters import IMAGE_MARK, RowError, converter, detect
from vlm.data import check_record, where
from vlm.images import ImageError, ResizePolicy, load_images

# R1-style output format (DeepSeek-R1, arXiv 2501.12948; as in EasyR1 / R1-V prompts).
R1_INSTRUCTION = ("First think through the problem step by step, then give the final answer. Put the reasoning "
                  "inside <think> </think> tags and the final answer inside <answer> </answer> tags, i.e. "
                  "<think> reasoning here </think><answer> answer here </answer>.")


@dataclass(eq=False)
class PromptInputs:
    """One prompt, ready for generation and scoring (shared by the G samples of its group).

    input_ids:      [L] prompt token ids (chat template applied, image placeholders expanded).
    token_inputs:   per-token language-model inputs, each [L] (e.g. Qwen's mm_token_type_ids).
    image_inputs:   per-image language-model inputs, each [n_img, ...] (e.g. image_grid_thw).
    encoder_inputs: vision-encoder inputs (pixel_values, image_grid_thw, pixel_attention_mask ...).
    features:       the encoder's output for these images, computed once per rollout (no grad).
    """

    input_ids: torch.Tensor
    token_inputs: dict
    image_inputs: dict
    encoder_inputs: dict
    text: str
    images: list
    resize: list
    row: dict
    truncated: bool = False
    features: object = None
    n_image_tokens: int = 0
    meta: dict = field(default_factory=dict)


def format_text(prompt: str, format_prompt: str) -> str:
    """Apply `policy.format_prompt`: `r1`, `none`, or a template holding `{prompt}`."""
    if format_prompt == "r1":
        return f"{prompt.rstrip()}\n{R1_INSTRUCTION}"
    if format_prompt == "none":
        return prompt
    return format_prompt.replace("{prompt}", prompt)


def build_messages(prompt: str, n_images: int, system: str | None) -> list[dict]:
    """Chat messages with image parts at the `<image>` marks (or first)."""
    content: list[dict] = []
    if IMAGE_MARK in prompt:
        pieces = prompt.split(IMAGE_MARK)
        for k, piece in enumerate(pieces):
            if piece.strip():
                content.append({"type": "text", "text": piece})
            if k < len(pieces) - 1:
                content.append({"type": "image"})
    else:
        content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": prompt}]
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    return messages + [{"role": "user", "content": content}]


@dataclass(frozen=True)
class PromptOptions:
    """The `policy:` keys that shape a prompt (see `vlm.policy.Config`)."""

    system_prompt: str | None = None
    format_prompt: str = "r1"
    max_prompt_tokens: int = 2048
    truncation: str = "error"
    image_root: str | None = None
    require_answer: bool = True

    @classmethod
    def from_config(cls, cfg) -> "PromptOptions":
        return cls(cfg.system_prompt, cfg.format_prompt, cfg.max_prompt_tokens, cfg.truncation, cfg.image_root,
                   cfg.require_answer)


@dataclass(frozen=True)
class InputKeys:
    """Which processor outputs each part of the model takes (parameter names of its methods)."""

    encoder: frozenset               # parameters of the model's get_image_features
    forward: frozenset               # parameters of the model's forward


@dataclass
class PromptBuilder:
    """Turns records into `PromptInputs` (picklable: runs in DataLoader workers)."""

    processor: object
    resize: ResizePolicy
    keys: InputKeys
    protected_ids: frozenset         # token ids truncation never removes
    options: PromptOptions = field(default_factory=PromptOptions)
    image_kwargs: dict = field(default_factory=dict)   # processor call kwargs (Qwen-VL pixel bounds)

    def record(self, row: dict) -> dict:
        """A PromptBatch row in the schema (idempotent: schema rows come back unchanged)."""
        try:
            rec = converter(detect(row))(row)
            check_record(rec, self.options.require_answer, images=False)
        except RowError as e:
            raise ConfigError(f"{where(row)}: {e}") from None
        return rec

    def __call__(self, row: dict) -> PromptInputs:
        rec = self.record(row)
        try:
            images, resize = load_images(rec["images"], self.options.image_root, self.resize)
        except ImageError as e:
            raise ConfigError(f"{where(rec)}: {e}") from None
        system = rec.get("system") or self.options.system_prompt
        messages = build_messages(format_text(rec["prompt"], self.options.format_prompt), len(images), system)
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        kwargs = self.image_kwargs if images else {}
        enc = self.processor(text=[text], images=images or None, return_tensors="pt", **kwargs)
        return self._split(enc, rec, images, resize)

    def _split(self, enc, rec: dict, images: list, resize: list) -> PromptInputs:
        ids, token, image, encoder = split_encoding(enc, self.keys)
        keep = self._keep_mask(ids, rec)                                            # [L] bool
        truncated = not bool(keep.all())
        if truncated:
            ids, token = ids[keep], {k: v[keep] for k, v in token.items()}
        meta = {k: v for k, v in rec.items() if k not in ("prompt", "images", "answer", "system")
                and not k.startswith("_")}
        return PromptInputs(ids, token, image, encoder if images else {}, rec["prompt"], images, resize, rec,
                            truncated, meta=meta)

    def _keep_mask(self, ids: torch.Tensor, rec: dict) -> torch.Tensor:
        """Which prompt tokens survive truncation to `max_prompt_tokens`."""
        limit, cut_left = self.options.max_prompt_tokens, self.options.truncation == "left"
        keep = torch.ones_like(ids, dtype=torch.bool)
        excess = ids.numel() - limit
        if excess <= 0:
            return keep
        protected = torch.tensor([int(t) in self.protected_ids for t in ids.tolist()])
        if not cut_left or int((~protected).sum()) < excess:
            need = int(protected.sum())
            raise ConfigError(
                f"{where(rec)}: the prompt has {ids.numel()} tokens (> policy.max_prompt_tokens="
                f"{limit}; {need} are image placeholders or special tokens that are never cut). "
                + ("Set policy.truncation=left to drop the earliest text tokens, or raise" if not cut_left else "Raise")
                + " policy.max_prompt_tokens or lower policy.max_pixels.")
        drop = torch.nonzero(~protected).squeeze(1)[:excess]
        keep[drop] = False
        return keep


def split_encoding(enc, keys: InputKeys) -> tuple[torch.Tensor, dict, dict, dict]:
    """A one-text processor output -> (input_ids [L], per-token inputs {name: [L]}, per-image inputs
    {name: [n_img, ...]}, vision-encoder inputs), sorted by the model method that takes each key."""
    ids = enc["input_ids"][0]                                                       # [L]
    token, image, encoder = {}, {}, {}
    for key, value in enc.items():
        if key in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
            continue
        if key in keys.encoder:
            encoder[key] = value
        if key in keys.forward and not key.startswith("pixel_"):
            if value.dim() >= 2 and value.shape[:2] == enc["input_ids"].shape:
                token[key] = value[0]                                               # [L]
            else:
                image[key] = value                                                  # [n_img, ...]
    return ids, token, image, encoder


def check_image_tokens(prompt: PromptInputs, image_token_id: int | None) -> None:
    """Fail clearly if a prompt's image placeholders do not match its image features."""
    if image_token_id is None:
        return
    n_tokens = int((prompt.input_ids == image_token_id).sum())
    n_features = count_features(prompt.features)
    if n_tokens != n_features:
        raise ConfigError(
            f"{where(prompt.row)}: image placeholder tokens in the prompt ({n_tokens}) != image features "
            f"({n_features}) for {len(prompt.images)} image(s). The prompt text may contain a literal "
            "placeholder token, or the processor and model disagree (check policy.processor).")
    prompt.n_image_tokens = n_tokens



def count_features(features) -> int:
    """Rows of image features in a (slimmed, see `vlm.features.slim`) encoder output; 0 for none."""
    return 0 if features is None else sum(int(p.shape[0]) for p in features.pooled)
