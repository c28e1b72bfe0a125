"""A live trajectory's KV cache across turns: each turn prefills only what the model has not seen.

With the whole history kept (`env.history_turns: null`) each turn's context is the last one, the reply and the
segment that followed it (an observation or tool results; vlm/turns.py). Re-prefilling the whole context every
turn costs O(turns^2) tokens over an episode; here each trajectory keeps the cache of what it has read, and a turn
runs the model over the new tokens only:

    cached   the context of the last turn and the reply's tokens but its last (a sampled token is fed when the
             next one is drawn: the last never was)
    new      the reply's last token and the segment after it, with its images (their encoder output, computed
             once when the segment was built) and the positions a forward over the whole context gives them
             (Qwen2.5-VL's multimodal RoPE: `get_rope_index` over the whole context; 1-D: their offsets)

The group's continued trajectories run their new tokens in one forward, and their replies are decoded together,
their caches left-padded into one (as prompts of different lengths are for `generate`); each trajectory's own
cache is cut back out afterwards. The first turn of a group prefills the shared first prompt once. A context that
is not the cached one extended (a history window that moved) is prefilled afresh. Generation only: a trajectory is still scored by one forward over its whole sequence
(vlm/trajectory.py), so the trained log-probs, and the on-policy ratio of exactly 1, do not depend on the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlm.features import Encoded, base_model, merge
from vlm.prefix import _cache_kwarg, _mrope, decode_from, mrope_index, prefill, prefix_batch, rope_delta


@dataclass(eq=False)
class TurnCache:
    """What one trajectory's cache holds: `ids` [c] the tokens read, `cache` the KV cache (batch 1)."""

    ids: torch.Tensor
    cache: object


def _new_features(x, cached: int, image_token_id: int | None):
    """The encoder output of the images whose tokens lie after position `cached` of `x`, with their
    per-image inputs (e.g. image_grid_thw); (None, {}) without any."""
    if x.features is None or image_token_id is None:
        return None, {}
    before = int((x.input_ids[:cached] == image_token_id).sum())
    pooled, seen, first = x.features.pooled, 0, len(x.features.pooled)
    for i, t in enumerate(pooled):
        if seen >= before:
            first = i
            break
        seen += int(t.shape[0])
    if seen != before:
        raise ValueError("a cached prefix ends inside an image's tokens")
    if first == len(pooled):
        return None, {}
    features = Encoded(x.features.output_cls, tuple(pooled[first:]), x.features.stacked)
    images = {k: v[first:] for k, v in x.image_inputs.items()}
    return features, images


def _positions(hf, x, cached: int, pad_id: int, image_token_id: int | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions of x's tokens from `cached` on, as a forward over all of x gives them; delta [1] of the text
    positions after x)."""
    index = mrope_index(hf, prefix_batch(x, pad_id, image_token_id, device)) if _mrope(hf) else None
    if index is not None:
        pos, delta = index
        return pos[:, :, cached:], delta
    steps = torch.arange(cached, int(x.input_ids.numel()), device=device)[None]       # 1-D (on 3 axes for mrope)
    return (steps.expand(3, -1, -1) if _mrope(hf) else steps), torch.zeros(1, dtype=torch.long, device=device)


def extend(hf, state: TurnCache, x, pad_id: int, image_token_id: int | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the model over x's tokens after `state.ids` (appending them to its cache): (hidden state [1, 1, H] that
    predicts the next token, delta [1])."""
    hidden, deltas, (cache,) = extend_rows(hf, [state], [x], pad_id, image_token_id, device)
    state.cache = cache
    return hidden, deltas


def extend_rows(hf, states: list, rows: list, pad_id: int, image_token_id: int | None, device):
    """`extend` for several trajectories in one forward: their caches left-padded into one, their new tokens
    left-padded after it (masked; each at the position a forward over its whole context gives it). Returns the hidden
    states [n, 1, H] that predict each row's next token, deltas [n], and each row's own cache of its whole context."""
    n = len(rows)
    cached = [int(st.ids.numel()) for st in states]
    added = [int(x.input_ids.numel()) - c for x, c in zip(rows, cached)]
    width_c, width_m = max(cached), max(added)
    cache, cache_mask = _batched([st.cache for st in states], cached)
    if cache_mask is None:
        cache_mask = torch.ones(n, width_c, dtype=torch.long, device=device)
    ids = torch.full((n, width_m), pad_id, dtype=torch.long, device=device)             # [n, M] left-padded
    new_mask = torch.zeros(n, width_m, dtype=torch.long, device=device)
    mrope = _mrope(hf)
    pos = torch.zeros((3, n, width_m) if mrope else (n, width_m), dtype=torch.long, device=device)
    token = {k: torch.zeros(n, width_m, dtype=v.dtype, device=device) for k, v in rows[0].token_inputs.items()}
    features, images, deltas = [], {}, []
    for i, (x, c, m) in enumerate(zip(rows, cached, added)):
        ids[i, width_m - m:] = x.input_ids[c:].to(device)
        new_mask[i, width_m - m:] = 1
        p, delta = _positions(hf, x, c, pad_id, image_token_id, device)               # [3, 1, m] or [1, m]
        if mrope:
            pos[:, i, width_m - m:] = p[:, 0]
        else:
            pos[i, width_m - m:] = p[0]
        deltas.append(delta)
        for k, v in x.token_inputs.items():
            token[k][i, width_m - m:] = v[c:].to(device)
        f, im = _new_features(x, c, image_token_id)
        features.append(f)
        for k, v in im.items():
            images.setdefault(k, []).append(v)
    kwargs = {**token, **{k: torch.cat(v).to(device) for k, v in images.items()}}
    merged = merge(features)
    if merged is not None:
        kwargs["mm_encoder_outputs"] = merged
    mask = torch.cat([cache_mask, new_mask], 1)                                         # [n, C + M]
    out = base_model(hf)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, return_dict=True,
                         **{_cache_kwarg(hf): cache}, **kwargs)
    own = [_cut(cache, i, [(width_c - c, width_c), (width_c + width_m - m, width_c + width_m)])
           for i, (c, m) in enumerate(zip(cached, added))]
    return out.last_hidden_state[:, -1:], torch.cat(deltas), own


def start(hf, x, pad_id: int, image_token_id: int | None, device) -> tuple[TurnCache, torch.Tensor, torch.Tensor]:
    """A fresh cache of x: (state, hidden [1, 1, H] predicting the next token, delta [1])."""
    batch = prefix_batch(x, pad_id, image_token_id, device, features=[x.features])
    last, cache = prefill(hf, batch)
    return TurnCache(x.input_ids.clone(), cache), last[:, -1:], rope_delta(hf, batch)


def is_continued(state: TurnCache | None, x) -> bool:
    n = int(state.ids.numel()) if state is not None else 0
    return state is not None and int(x.input_ids.numel()) > n and torch.equal(x.input_ids[:n], state.ids)


def _batched(entries: list, lengths: list[int]):
    """One KV cache of n rows from n one-row caches of `lengths` tokens, each left-padded to the longest: (cache,
    mask [n, L] of real entries or None when none is padded)."""
    from transformers import DynamicCache

    width = max(lengths)
    layers = []
    for li in range(len(entries[0].layers)):
        keys = [F.pad(c.layers[li].keys, (0, 0, width - n, 0)) for c, n in zip(entries, lengths)]   # [1, H, L, D]
        values = [F.pad(c.layers[li].values, (0, 0, width - n, 0)) for c, n in zip(entries, lengths)]
        layers.append((torch.cat(keys), torch.cat(values)))                                       # [n, H, L, D]
    if all(n == width for n in lengths):
        return DynamicCache(ddp_cache_data=layers), None
    mask = torch.zeros(len(lengths), width, dtype=torch.long, device=layers[0][0].device)
    for i, n in enumerate(lengths):
        mask[i, width - n:] = 1
    return DynamicCache(ddp_cache_data=layers), mask


def _cut(cache, i: int, spans: list[tuple[int, int]]):
    """Row i's own cache out of a batched one: the entries of `spans` [(start, end)] of its sequence, in order."""
    from transformers import DynamicCache

    layers = []
    for layer in cache.layers:
        keep = lambda t: torch.cat([t[i:i + 1, :, lo:hi] for lo, hi in spans], 2)  # noqa: E731
        layers.append((keep(layer.keys), keep(layer.values)))
    return DynamicCache(ddp_cache_data=layers)


@torch.no_grad()
def sample_turns(hf, rows: list, states: list, processors, max_new_tokens: int, stop_ids: list[int],
                 pad_id: int, image_token_id: int | None, device) -> tuple[list[torch.Tensor], list[TurnCache]]:
    """Each row's reply [t] from its context, continuing its cache where the context extends it (one forward over
    the new tokens per row), then decoding the rows together from their caches left-padded into one; `processors`
    as for `generate` over the rows. Returns the replies (up to and with the stop token) and the rows' new states
    (module docstring)."""
    n = len(rows)
    caches, hiddens, deltas = [None] * n, [None] * n, [None] * n
    going = [i for i in range(n) if is_continued(states[i], rows[i])]
    if going:                                          # the continued rows: one forward over their new tokens
        hidden, delta, own = extend_rows(hf, [states[i] for i in going], [rows[i] for i in going], pad_id,
                                         image_token_id, device)
        for k, i in enumerate(going):
            caches[i], hiddens[i], deltas[i] = own[k], hidden[k:k + 1], delta[k:k + 1]
    fresh: dict = {}                                   # the others: each distinct context prefilled once
    for i in range(n):
        if caches[i] is None:
            x = rows[i]
            if id(x) not in fresh:
                fresh[id(x)] = start(hf, x, pad_id, image_token_id, device)
            base, hiddens[i], deltas[i] = fresh[id(x)]
            caches[i] = base.cache                       # read only: the rows' caches are cut out of the batch below
    lengths = [int(x.input_ids.numel()) for x in rows]
    width = max(lengths)
    cache, mask = _batched(caches, lengths)
    seq = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)        # [n, L] for the processors
    for i, x in enumerate(rows):
        seq[i, width - lengths[i]:] = x.input_ids.to(device)
    tokens = decode_from(hf, torch.cat(hiddens), cache, seq, torch.tensor(lengths, device=device), torch.cat(deltas),
                         mask, processors, max_new_tokens, stop_ids, pad_id)            # [n, t]
    stops = torch.tensor(stop_ids, device=device)
    replies, out_states = [], []
    for i, x in enumerate(rows):
        row = tokens[i]
        hit = torch.nonzero(torch.isin(row, stops))
        reply = row[:int(hit[0]) + 1] if hit.numel() else row
        fed = int(reply.numel()) - 1                                                    # the last is not fed
        replies.append(reply)
        out_states.append(TurnCache(torch.cat([x.input_ids, reply[:-1].to(x.input_ids.device)]),
                                    _cut(cache, i, [(width - lengths[i], width), (width, width + fed)])))
    return replies, out_states
