"""Model inputs for a batch of rows: one layout shared by generation and scoring.

Row r of a batch is laid out as

    [ pad * a_r | prompt_r | completion_r | pad ... ]   a_r = prompt_width - len(prompt_r)

so every prompt ends at column `prompt_width` and completions start there, as in the output
of left-padded `generate`. A rollout records `prompt_width` and the total `width` of its
layout per sample; re-scoring lays each sample out at exactly those widths, which makes its
log-probs independent of the other rows in the microbatch (CPU fp32 attention is not
bitwise invariant to the padded width; it is to the batch composition).

The image-token invariant ("image placeholder tokens = image feature rows") is checked on
every batch built here, naming the offending rows, before the model's own opaque error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.config import ConfigError
from vlm.data import where
from vlm.features import merge
from vlm.prompts import PromptInputs, count_features


@dataclass(frozen=True)
class Layout:
    prompt_width: int   # P: prompt region, prompts left-padded to it
    width: int          # W = P + completion region


def layout_for(prompts: list[PromptInputs], completions: list[torch.Tensor] | None) -> Layout:
    p = max(int(x.input_ids.numel()) for x in prompts)
    t = max((int(c.numel()) for c in completions), default=0) if completions else 0
    return Layout(p, p + t)


def check_image_tokens(ids: torch.Tensor, prompts: list[PromptInputs], image_token_id: int | None) -> None:
    if image_token_id is None:
        return
    per_row = (ids == image_token_id).sum(1).tolist()                       # [B]
    bad = [(r, n, count_features(p.features) if p.features is not None else p.n_image_tokens)
           for r, (n, p) in enumerate(zip(per_row, prompts))]
    bad = [b for b in bad if b[1] != b[2]]
    if bad:
        r, n, m = bad[0]
        raise ConfigError(
            f"image placeholder tokens in the batch ({sum(per_row)}) != image features "
            f"({sum(count_features(p.features) for p in prompts)}): row {r} ({where(prompts[r].row)}) has {n} "
            f"placeholder tokens for {m} feature rows ({len(bad)} bad rows). A completion holding an image "
            "placeholder (blocked during generation) or a truncated prompt causes this.")


def collate(prompts: list[PromptInputs], completions: list[torch.Tensor] | None, layout: Layout,
            pad_id: int, image_token_id: int | None, device, features: list | None = None) -> dict:
    """Forward / generate keyword arguments for rows (prompt_r, completion_r) at `layout`.

    `features` (one encoder output per row) defaults to each prompt's cached `features`.
    """
    b, w, p = len(prompts), layout.width, layout.prompt_width
    ids = torch.full((b, w), pad_id, dtype=torch.long)                       # [B, W]
    mask = torch.zeros((b, w), dtype=torch.long)                             # [B, W]
    token_keys = sorted({k for x in prompts for k in x.token_inputs})
    token = {k: torch.zeros((b, w), dtype=next(x.token_inputs[k].dtype for x in prompts if k in x.token_inputs))
             for k in token_keys}
    for r, x in enumerate(prompts):
        lp = int(x.input_ids.numel())
        comp = completions[r] if completions else x.input_ids[:0]
        if lp > p or p + comp.numel() > w:
            raise ValueError(f"row {r} does not fit layout {layout}: prompt {lp}, completion {comp.numel()}")
        ids[r, p - lp:p] = x.input_ids
        ids[r, p:p + comp.numel()] = comp
        mask[r, p - lp:p + comp.numel()] = 1
        for k in x.token_inputs:
            token[k][r, p - lp:p] = x.token_inputs[k]                       # completions are text (type 0)
    check_image_tokens(ids, prompts, image_token_id)
    out = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    out.update({k: v.to(device) for k, v in token.items()})
    for key in sorted({k for x in prompts for k in x.image_inputs}):
        parts = [x.image_inputs[key] for x in prompts if key in x.image_inputs]
        out[key] = torch.cat(parts).to(device)
    encoded = merge(features if features is not None else [x.features for x in prompts])
    if encoded is not None:
        out["mm_encoder_outputs"] = encoded
    return out
