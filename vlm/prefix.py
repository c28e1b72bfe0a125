"""Shared prompt prefix: each prompt's tokens run through the language model once per group.

The G samples of a prompt share its whole prompt (system text, question, image tokens). Instead of
running that prefix G times, the prefix runs once (batch 1) and its KV cache (transformers'
`DynamicCache`, `batch_repeat_interleave`) is copied to the rows that continue it:

- generation (`decode`): prefill once, then a greedy decode loop over the G rows with the same
  logits processors `generate` applies (vlm.generation's seeded sampler picks each token), so the
  tokens equal `generate`'s own under the same seeds (tested token for token). A loop of our own rather
  than `generate(cache=...)`: it passes every position explicitly, where `generate` continuing a cache
  would rebuild Qwen2.5-VL's from the `rope_deltas` the model stored in its last forward;
- scoring (`score_hidden`): the prefix forward runs with grad, the completions run against the copied
  cache, so every completion's gradient flows into one prefix computation; the first completion token
  is predicted by the prefix's last hidden state.

Positions: a completion token k of a prompt of length L sits at L + k in 1-D RoPE models (LLaVA).
Qwen2.5-VL's multimodal RoPE gives text after the prompt the 3-D position (L + k + delta) on all three
axes, delta = max prompt position + 1 - L (`get_rope_index`); passing explicit positions avoids the
model's stored `rope_deltas`, which belong to whichever forward ran last. Other architectures keep
the unshared path (`reason_unshared` says why): their attention or position layout is not verified
against the unshared forward here, and a wrong guess would silently change every log-prob.
"""

from __future__ import annotations

import inspect

import torch

from vlm.batch import Layout, collate
from vlm.features import base_model

# CPU GEMM kernels round differently for matrices of a handful of rows (under ~6 rows: a GEMV-like path),
# so a row's result would depend on how many rows share the forward; the completion forward of a prompt
# holds at least this many positions (extra rows copy the first and are dropped), which keeps each row's
# log-probs independent of its microbatch neighbours (the on-policy ratio stays exactly 1).
MIN_POSITIONS = 64

# model_type -> position layout; each verified against the unshared forward in tests/vlm/test_vlm_prefix.py
VERIFIED = {"llava": "1d", "qwen2_5_vl": "mrope"}


def reason_unshared(hf, training: bool = False) -> str | None:
    """Why `hf` cannot share prefixes (None when it can); `training`: for the scoring forward."""
    kind = getattr(hf.config, "model_type", None)
    if kind not in VERIFIED:
        return f"model type {kind!r} is not one of the verified {sorted(VERIFIED)}"
    checkpointed = "is_activation_checkpointing" if hasattr(type(hf), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    if training and getattr(hf, checkpointed, False):
        return "gradient checkpointing drops the KV cache in training mode"
    return None


def prefix_batch(x, pad_id: int, image_token_id: int | None, device, features: list | None = None) -> dict:
    """One prompt's model inputs, unpadded ([1, L])."""
    n = int(x.input_ids.numel())
    return collate([x], None, Layout(n, n), pad_id, image_token_id, device, features=features)


def _mrope(hf) -> bool:
    return VERIFIED.get(getattr(hf.config, "model_type", None)) == "mrope"


def mrope_index(hf, batch: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(3-D positions [3, B, L], delta [B]) of `batch` exactly when the model's own forward computes 3-D
    positions (multimodal RoPE and a batch with images); None where it uses 1-D positions."""
    grid, types = batch.get("image_grid_thw"), batch.get("mm_token_type_ids")
    if not _mrope(hf) or grid is None or types is None:
        return None
    pos, delta = base_model(hf).get_rope_index(batch["input_ids"], image_grid_thw=grid, video_grid_thw=None,
                                               attention_mask=batch["attention_mask"], mm_token_type_ids=types)
    return pos, delta.view(-1).to(batch["input_ids"].device)


def rope_delta(hf, batch: dict) -> torch.Tensor:
    """delta [B] of the text positions after each prompt of `batch` (0 where positions are 1-D)."""
    index = mrope_index(hf, batch)
    return index[1] if index is not None else torch.zeros(batch["input_ids"].shape[0], dtype=torch.long,
                                                            device=batch["input_ids"].device)


def positions(hf, start: torch.Tensor, length: int, delta: torch.Tensor) -> torch.Tensor:
    """Position ids of `length` text tokens after prompts of `start` [n] real tokens: [3, n, length] for
    multimodal RoPE, else [n, length]."""
    steps = start[:, None] + delta[:, None] + torch.arange(length, device=start.device)   # [n, length]
    return steps.expand(3, -1, -1) if _mrope(hf) else steps


def prefill(hf, batch: dict):
    """The prefix forward: (hidden states [B, L, H], KV cache). Left padding (several prompts) gets 1-D
    positions counted over real tokens, as `generate` gives them; 3-D positions the model computes."""
    kwargs = {}
    if not _mrope(hf) and not bool(batch["attention_mask"].all()):
        mask = batch["attention_mask"]
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)                     # [B, L]
    out = base_model(hf)(**batch, **kwargs, use_cache=True, return_dict=True)
    return out.last_hidden_state, out.cache if hasattr(out, "cache") else out.past_key_values


def _cache_kwarg(hf) -> str:
    """The forward's KV-cache argument: `cache` (transformers >= 5.24) or `past_key_values` (earlier)."""
    return "cache" if "cache" in inspect.signature(base_model(hf).forward).parameters else "past_key_values"


def continue_rows(hf, cache, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Hidden states [n, t, H] of tokens `ids` [n, t] at positions `pos` after the cached prefix (one cache
    row per row); `mask` [n, cached + t] or None when every position is real."""
    out = base_model(hf)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, return_dict=True,
                         **{_cache_kwarg(hf): cache})
    return out.last_hidden_state


def score_hidden(hf, batch: dict, completions: list, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states predicting each completion token and the targets, [n, T, H] and [n, T], for the n
    completions (right-padded to `width` = T) of the one prompt in `batch`; differentiable."""
    n, device = len(completions), batch["input_ids"].device
    length = int(batch["input_ids"].shape[1])
    k = max(n, -(-MIN_POSITIONS // max(width - 1, 1)))                                  # rows run, >= n
    ids = torch.full((k, width), pad_id, dtype=torch.long)                              # [k, T]
    mask = torch.zeros((k, width), dtype=torch.long)                                    # [k, T]
    for r in range(k):
        c = completions[r] if r < n else completions[0]
        ids[r, :c.numel()] = c
        mask[r, :c.numel()] = 1
    ids, mask = ids.to(device), mask.to(device)
    delta = rope_delta(hf, batch).expand(k)                                             # [k]
    last, cache = prefill(hf, batch)                                                     # [1, L, H]
    hidden = last[:, -1:].expand(n, 1, last.shape[-1])                                  # [n, 1, H] predicts token 0
    if width > 1:
        cache.batch_repeat_interleave(k)
        attn = torch.cat([torch.ones(k, length, dtype=mask.dtype, device=device), mask[:, :-1]], 1)  # [k, L + T-1]
        pos = positions(hf, torch.full((k,), length, device=device), width - 1, delta)
        rest = continue_rows(hf, cache, ids[:, :-1], pos, attn)[:n]                      # [n, T-1, H]
        hidden = torch.cat([hidden, rest], 1)                                           # [n, T, H]
    return hidden, ids[:n]


@torch.no_grad()
def decode(hf, batch: dict, index: torch.Tensor, processors, max_new_tokens: int, stop_ids: list,
           pad_id: int, stop=None) -> torch.Tensor:
    """Continuations [n, t] (t <= max_new_tokens) of rows whose prompt is row `index[r]` of `batch` (the
    distinct prompts, left-padded): each prompt prefilled once, then greedy decoding of the processed
    scores, as `generate(do_sample=False, logits_processor=processors)` does; rows that reached a stop
    token are padded with `pad_id`; decoding stops when every row has, or after a token where `stop()`
    (a stopping criterion, called once per token boundary) returns True."""
    device = batch["input_ids"].device
    index = index.to(device)
    prompt_mask = batch["attention_mask"][index]                                        # [n, L]
    start = prompt_mask.sum(1)                                                          # [n] real prompt tokens
    delta = rope_delta(hf, batch)[index]                                                # [n]
    last, cache = prefill(hf, batch)                                                     # [P, L, H]
    cache.batch_select_indices(index)
    return decode_from(hf, last[index, -1:], cache, batch["input_ids"][index], start, delta,
                       None if bool(prompt_mask.all()) else prompt_mask, processors, max_new_tokens, stop_ids,
                       pad_id, stop)


@torch.no_grad()
def decode_from(hf, hidden: torch.Tensor, cache, seq: torch.Tensor, start: torch.Tensor, delta: torch.Tensor,
                prompt_mask: torch.Tensor | None, processors, max_new_tokens: int, stop_ids: list, pad_id: int,
                stop=None) -> torch.Tensor:
    """The decode loop of `decode` from a cache of n rows: `hidden` [n, 1, H] predicts each row's first token,
    `seq` [n, L] the tokens so far (for the processors), `start` [n] the real tokens cached, `delta` [n] the text
    positions' offset, `prompt_mask` [n, L] when rows are left-padded (else None). Returns [n, t]; each token
    but the last is fed to the cache."""
    head, device = hf.get_output_embeddings(), seq.device
    n = int(seq.shape[0])
    live = torch.ones(n, dtype=torch.bool, device=device)                               # [n]
    stops = torch.tensor(stop_ids, device=device)
    new = []
    for t in range(max_new_tokens):
        scores = processors(seq, head(hidden)[:, -1].float())                           # [n, V]
        token = torch.where(live, scores.argmax(-1), torch.full_like(live, pad_id, dtype=torch.long))  # [n]
        new.append(token)
        seq = torch.cat([seq, token[:, None]], 1)
        live &= ~torch.isin(token, stops)
        if not live.any() or t == max_new_tokens - 1 or (stop is not None and stop()):
            break
        mask = None
        if prompt_mask is not None:
            mask = torch.cat([prompt_mask, torch.ones(n, t + 1, dtype=prompt_mask.dtype, device=device)], 1)
        hidden = continue_rows(hf, cache, token[:, None], positions(hf, start + t, 1, delta), mask)   # [n, 1, H]
    return torch.stack(new, 1)                                                          # [n, t]
