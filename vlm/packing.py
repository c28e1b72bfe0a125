"""Padding-free scoring: the rows of a forward concatenated into one sequence.

Row r (prompt_r, then completion_r, no padding) occupies columns [cu[r], cu[r+1]) of one [1, sum_r len_r]
sequence. Its position ids restart at 0 (Qwen2.5-VL: the 3-D positions `get_rope_index` gives the row
alone, plus the 1-D text positions in front, the [4, 1, total] layout transformers reads as packed), and
attention never crosses a row boundary:

- on GPU with `attn_implementation: flash_attention_2/3`, transformers' varlen kernels take the
  boundaries from `cu_seq_lens_q/k` (untested here);
- otherwise a registered attention function (`mmrl_segments`) runs SDPA causally on each row's own
  columns, so a row's attention is exactly what it would be alone, whatever rows share the forward.

A forward's cost then follows its real tokens, not n times its longest row. Every other op works row by
row (GEMMs of more than a handful of rows are row-invariant on CPU, see vlm.prefix.MIN_POSITIONS), so a
row's log-probs do not depend on its neighbours and the on-policy ratio stays exactly 1.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from vlm.batch import Layout, collate
from vlm.features import merge
from vlm.prefix import MIN_POSITIONS, VERIFIED, mrope_index

ATTENTION = "mmrl_segments"


def _segment_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal SDPA on each packed row alone; query [1, heads, total, d] -> [1, total, heads, d]."""
    cu = kwargs["cu_seq_lens_q"].tolist()
    outs = [sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None,
                                   dropout=dropout, scaling=scaling, is_causal=True)[0]
            for a, b in zip(cu[:-1], cu[1:])]
    return torch.cat(outs, 1), None


AttentionInterface.register(ATTENTION, _segment_attention)


@contextlib.contextmanager
def segment_attention(hf):
    """The language model's attention runs per packed row during the block (flash-attention kernels,
    which read the boundaries themselves, are kept)."""
    text = hf.config.get_text_config()
    old = text._attn_implementation
    if old and old.startswith("flash_attention"):
        yield
        return
    text._attn_implementation = ATTENTION
    try:
        yield
    finally:
        text._attn_implementation = old


def _row_positions(hf, row: dict, length: int) -> torch.Tensor:
    """[4, 1, L] (text + 3-D, multimodal RoPE) or [1, L] position ids of one unpadded row."""
    text = torch.arange(length, device=row["input_ids"].device)[None]                    # [1, L]
    if VERIFIED.get(hf.config.model_type) != "mrope":
        return text
    index = mrope_index(hf, row)
    pos = index[0] if index is not None else text[None].expand(3, -1, -1)                # [3, 1, L]
    return torch.cat([text[None], pos])                                                  # [4, 1, L]


def packed_inputs(hf, prompts: list, completions: list, pad_id: int, image_token_id: int | None, device,
                  features: list) -> tuple[dict, list]:
    """Model inputs of the packed sequence and each row's first column; a short pack gets a trailing
    filler row of pad tokens so the pack holds at least MIN_POSITIONS columns."""
    rows, starts, at = [], [], 0
    for x, c, f in zip(prompts, completions, features):
        n = int(x.input_ids.numel()) + int(c.numel())
        row = collate([x], [c], Layout(int(x.input_ids.numel()), n), pad_id, image_token_id, device, features=[f])
        rows.append(row)
        starts.append(at)
        at += n
    lengths = [int(r["input_ids"].shape[1]) for r in rows]
    if at < MIN_POSITIONS:
        filler = MIN_POSITIONS - at
        ids = torch.full((1, filler), pad_id, dtype=torch.long, device=device)
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        lengths.append(filler)
    pos = [_row_positions(hf, r, n) for r, n in zip(rows, lengths)]
    out = {"input_ids": torch.cat([r["input_ids"] for r in rows], 1), "position_ids": torch.cat(pos, -1)}
    cu = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
    out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    encoded = merge(features)
    if encoded is not None:
        out["mm_encoder_outputs"] = encoded
    return out, starts
