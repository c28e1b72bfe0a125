"""`TokenScorer`: the one forward that scores sampled tokens, for the rollout's old log-probs and
for every training microbatch (rollout scoring and training share it), so the first on-policy ratio is exactly 1.

Notation: n rows, P prompt width, T completion width of a layout, V vocabulary, H hidden.
The scored distribution is the one the rollout sampled from (before top-p/top-k, as in veRL
and EasyR1): softmax((logits + block_bias) / temperature), where block_bias is -1e9 on the
tokens generation never emits (image placeholders and other special tokens). Log-softmax
runs in fp32 over chunks of `chunk` positions and keeps only the sampled tokens' log-probs
and the per-token entropy (the lm_head runs in matmuls of exactly `chunk` positions, so a token's
log-prob does not depend on how many rows share the forward); with grad enabled each chunk is checkpointed, so neither
[n, T, V] logits nor their log-softmax are ever held whole.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from vlm.batch import Layout, check_image_tokens, collate
from vlm.features import base_model, encode
from vlm.packing import packed_inputs, segment_attention
from vlm.prefix import prefix_batch, reason_unshared, score_hidden

BLOCK_BIAS = -1e9   # finite, so p * log p stays 0 (not NaN) for blocked tokens


def _logits(h: torch.Tensor, lm_head, rows: int) -> torch.Tensor:
    """lm_head over the n c positions of h [n, c, H] in matmuls of exactly `rows` positions (the last one
    padded with copies of the first position): a position's logits then never depend on how many rows
    share the call (CPU GEMM kernels are picked by shape and round differently, e.g. 4 vs 20 rows)."""
    flat = h.reshape(-1, h.shape[-1])                                  # [n c, H]
    m = flat.shape[0]
    if m % rows:
        flat = torch.cat([flat, flat[:1].expand(rows - m % rows, -1)])
    out = torch.cat([lm_head(block) for block in flat.split(rows)])[:m]  # [n c, V]
    return out.view(*h.shape[:-1], out.shape[-1])                       # [n, c, V]


def _chunk_scores(h: torch.Tensor, targets: torch.Tensor, lm_head, bias: torch.Tensor, temperature: float,
                  softcap: float | None, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _logits(h, lm_head, rows).float()                         # [n, c, V] fp32
    if softcap:                                                        # Gemma-style final logit soft-capping
        logits = torch.tanh(logits / softcap) * softcap
    logits = (logits + bias) / temperature                             # [n, c, V]
    logp_all = torch.log_softmax(logits, dim=-1)                       # [n, c, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)      # [n, c]
    entropy = -(logp_all.exp() * logp_all).sum(-1)                     # [n, c]
    return logp, entropy


def token_scores(hidden: torch.Tensor, targets: torch.Tensor, lm_head, bias: torch.Tensor, temperature: float,
                 softcap: float | None, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies [n, T] of `targets` [n, T] from hidden states [n, T, H]."""
    logps, ents = [], []
    for s in range(0, hidden.shape[1], chunk):
        args = (hidden[:, s:s + chunk], targets[:, s:s + chunk], lm_head, bias, temperature, softcap, chunk)
        if torch.is_grad_enabled():
            lp, en = checkpoint(_chunk_scores, *args, use_reentrant=False)
        else:
            lp, en = _chunk_scores(*args)
        logps.append(lp)
        ents.append(en)
    return torch.cat(logps, 1), torch.cat(ents, 1)                     # [n, T], [n, T]


def one_layout_if_sharded(scorer, layouts: list) -> list:
    """Under FSDP (`mmrl.distributed.sharding`) every row of a call at one shared layout: each rank then runs exactly one
    model forward per call, so the per-block collectives pair up across ranks whatever layouts each holds
    (and a block is gathered once per microbatch, not once per layout). Log-probs then depend on the other
    rows of the call within fp32 rounding; the on-policy ratio of a single pass stays exactly 1."""
    from mmrl.distributed.sharding import is_sharded

    if not is_sharded(scorer) or len(set(layouts)) <= 1:
        return layouts
    p = max(lo.prompt_width for lo in layouts)
    shared = Layout(p, p + max(lo.width - lo.prompt_width for lo in layouts))
    return [shared] * len(layouts)


class TokenScorer(torch.nn.Module):
    """Wraps the Hugging Face model; `forward` is `predict` (the trainer prepares this module)."""

    def __init__(self, hf, blocked: list[int], temperature: float, chunk: int, pad_id: int,
                 image_token_id: int | None, encode_with_grad: bool, share_prefix: bool = False, pack: bool = False):
        super().__init__()
        self.hf = hf
        vocab = hf.get_output_embeddings().weight.shape[0]
        bias = torch.zeros(vocab)
        bias[[i for i in blocked if i < vocab]] = BLOCK_BIAS
        self.register_buffer("block_bias", bias, persistent=False)     # [V]
        self.temperature, self.chunk, self.pad_id = temperature, chunk, pad_id
        self.image_token_id, self.encode_with_grad = image_token_id, encode_with_grad
        self.softcap = getattr(hf.config.get_text_config(), "final_logit_softcapping", None)
        self.share_prefix = share_prefix          # policy.share_prefix_scoring (vlm.prefix)
        self.pack = pack                          # policy.pack_sequences (vlm.packing), where prefixes are not shared

    def packs(self) -> bool:
        """Rows scored padding-free in one packed forward: asked for, a verified model, no shared prefix, no
        gradient checkpointing (its recomputation in backward would run outside `segment_attention`)."""
        return self.pack and not self.shares_prefix() and reason_unshared(self.hf, training=True) is None

    def shares_prefix(self) -> bool:
        """Each prompt's prefix runs once for all its rows (`vlm.prefix`): asked for, verified for this model,
        and not sharded (under FSDP every rank must run the same number of forwards per call)."""
        from mmrl.distributed.sharding import is_sharded

        return self.share_prefix and reason_unshared(self.hf, training=True) is None and not is_sharded(self)

    def _features(self, prompts: list) -> list | None:
        """Fresh (with grad) encoder outputs per row when the vision side trains; else the cached ones."""
        if not self.encode_with_grad:
            return None
        fresh: dict[int, object] = {}
        for x in prompts:
            if id(x) not in fresh:
                fresh[id(x)] = encode(self.hf, x.encoder_inputs, self.block_bias.device)
        return [fresh[id(x)] for x in prompts]

    def _score_layout(self, prompts: list, completions: list, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        batch = collate(prompts, completions, layout, self.pad_id, self.image_token_id, self.block_bias.device,
                        features=self._features(prompts))
        out = base_model(self.hf)(**batch, use_cache=False, return_dict=True)
        p, t = layout.prompt_width, layout.width - layout.prompt_width
        hidden = out.last_hidden_state[:, p - 1:p - 1 + t]                           # [n, T, H]
        targets = batch["input_ids"][:, p:p + t]                                     # [n, T]
        return token_scores(hidden, targets, self.hf.get_output_embeddings(), self.block_bias,
                            self.temperature, self.softcap, self.chunk)

    def _score_shared(self, prompts: list, completions: list, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of one prompt: its prefix once (batch 1), the completions against its copied KV cache,
        right-padded to the layout's completion width."""
        batch = prefix_batch(prompts[0], self.pad_id, self.image_token_id, self.block_bias.device,
                             features=self._features(prompts[:1]))
        hidden, targets = score_hidden(self.hf, batch, completions, layout.width - layout.prompt_width, self.pad_id)
        rows = torch.cat([batch["input_ids"].expand(len(prompts), -1), targets], 1)    # [n, L + T]
        check_image_tokens(rows, prompts, self.image_token_id)   # a placeholder inside a completion
        return token_scores(hidden, targets, self.hf.get_output_embeddings(), self.block_bias,
                            self.temperature, self.softcap, self.chunk)                # [n, T], [n, T]

    def _score_packed(self, prompts: list, completions: list, layout: Layout | None) -> tuple[torch.Tensor, torch.Tensor]:
        """All rows in one padding-free forward (`vlm.packing`); [n, T] with T the longest completion."""
        device = self.block_bias.device
        features = self._features(prompts) or [x.features for x in prompts]
        batch, starts = packed_inputs(self.hf, prompts, completions, self.pad_id, self.image_token_id, device,
                                      features)
        with segment_attention(self.hf):
            out = base_model(self.hf)(**batch, use_cache=False, return_dict=True)
        t = max(int(c.numel()) for c in completions)
        cols = torch.zeros(len(prompts), t, dtype=torch.long)                                 # [n, T] predicting columns
        targets = torch.full((len(prompts), t), self.pad_id, dtype=torch.long)              # [n, T]
        for r, (x, c, s) in enumerate(zip(prompts, completions, starts)):
            first = s + int(x.input_ids.numel()) - 1
            cols[r] = first + torch.arange(t).clamp(max=int(c.numel()) - 1)
            targets[r, :c.numel()] = c
        hidden = out.last_hidden_state[0, cols.to(device)]                                  # [n, T, H]
        return token_scores(hidden, targets.to(device), self.hf.get_output_embeddings(), self.block_bias,
                            self.temperature, self.softcap, self.chunk)

    def _groups(self, prompts: list, layouts: list) -> list:
        """(score function, layout, rows) per forward: rows sharing a layout, and with a shared prefix also
        the prompt. Which path scores a row depends on the run's settings only, never on its neighbours."""
        shared = self.shares_prefix()
        if not shared and self.packs():
            return [(self._score_packed, None, list(range(len(prompts))))]
        keys = [(lo, id(x) if shared else 0) for lo, x in zip(layouts, prompts)]
        order = sorted(set(keys), key=lambda k: (k[0].prompt_width, k[0].width, keys.index(k)))
        fn = self._score_shared if shared else self._score_layout
        return [(fn, k[0], [r for r in range(len(prompts)) if keys[r] == k]) for k in order]

    def _score_actions(self, prompts: list, layout: Layout, actions: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows that are whole sequences (a trajectory's view, `vlm.trajectory`): log-probs and entropies
        [n, A] of the tokens at `actions[r] = (positions [a_r], column)`, left-padded to `layout.width`."""
        batch = collate(prompts, None, layout, self.pad_id, self.image_token_id, self.block_bias.device,
                        features=self._features(prompts))
        out = base_model(self.hf)(**batch, use_cache=False, return_dict=True)
        device, w = self.block_bias.device, layout.width
        a = max(int(pos.numel()) for pos, _ in actions)
        at = torch.zeros(len(prompts), a, dtype=torch.long, device=device)                  # [n, A] target positions
        for r, (x, (pos, _)) in enumerate(zip(prompts, actions)):
            at[r, :pos.numel()] = pos.to(device) + (w - int(x.input_ids.numel()))           # left padding offset
        at = at.clamp(min=1)                                                                # padding entries: any valid position
        hidden = out.last_hidden_state.gather(1, (at - 1)[..., None].expand(-1, -1, out.last_hidden_state.shape[-1]))
        targets = batch["input_ids"].gather(1, at)                                          # [n, A]
        return token_scores(hidden, targets, self.hf.get_output_embeddings(), self.block_bias,
                            self.temperature, self.softcap, self.chunk)                     # [n, A], [n, A]

    def _forward_actions(self, prompts: list, layouts: list, out_len: int, actions: list):
        n, device = len(prompts), self.block_bias.device
        layouts = one_layout_if_sharded(self, layouts)
        logp = torch.zeros(n, out_len, device=device)                                      # [n, T_out]
        ent = torch.zeros(n, out_len, device=device)
        for layout in sorted(set(layouts), key=lambda lo: (lo.prompt_width, lo.width)):
            rows = [r for r in range(n) if layouts[r] == layout]
            lp, en = self._score_actions([prompts[r] for r in rows], layout, [actions[r] for r in rows])  # [m, A]
            cols = torch.stack([actions[r][1] + torch.arange(lp.shape[1]) for r in rows]).to(device)     # [m, A]
            valid = torch.stack([torch.arange(lp.shape[1]) < actions[r][0].numel() for r in rows]).to(device)
            cols = cols.clamp(max=out_len - 1)
            idx = torch.tensor(rows, device=device)
            logp = logp.index_put((idx,), torch.zeros(len(rows), out_len, device=device).scatter_add(1, cols, lp * valid))
            ent = ent.index_put((idx,), torch.zeros(len(rows), out_len, device=device).scatter_add(1, cols, en * valid))
        return logp, ent

    def forward(self, prompts: list, completions: list | None, layouts: list, out_len: int, actions: list | None = None):
        """Log-probs and entropies [n, out_len] of each row's completion (0 past its end).

        Rows are scored in groups sharing a layout, each at exactly its recorded widths. With `actions`
        (one `(positions [a], column)` per row) the rows are whole sequences and what is scored are the
        tokens at those positions, written from that column on (multi-turn trajectories).
        """
        if actions is not None:
            return self._forward_actions(prompts, layouts, out_len, actions)
        if not self.packs():
            layouts = one_layout_if_sharded(self, layouts)
        n = len(prompts)
        device = self.block_bias.device
        logp = torch.zeros(n, out_len, device=device)                                # [n, T_out]
        ent = torch.zeros(n, out_len, device=device)                                 # [n, T_out]
        for score, layout, rows in self._groups(prompts, layouts):
            lp, en = score([prompts[r] for r in rows], [completions[r] for r in rows], layout)
            idx = torch.tensor(rows, device=device)
            t = lp.shape[1]
            logp = logp.index_put((idx,), torch.nn.functional.pad(lp, (0, out_len - t)))
            ent = ent.index_put((idx,), torch.nn.functional.pad(en, (0, out_len - t)))
        lengths = torch.tensor([int(c.numel()) for c in completions], device=device)  # [n]
        valid = torch.arange(out_len, device=device)[None, :] < lengths[:, None]    # [n, T_out]
        return logp * valid, ent * valid
