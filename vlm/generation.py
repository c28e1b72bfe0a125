"""Hugging Face `generate` backend: sampled (rollout) or greedy (evaluation) completions.

Blocked tokens: a random-init or drifting model happily samples `<|image_pad|>` and other
special tokens, after which re-scoring fails with "Image features and image tokens do not
match" (REFERENCE.md section 3; EasyR1 blocks them with a logit bias). `blocked_token_ids`
lists every special token except the stop tokens, plus the config's vision token ids and any
embedding rows past the tokenizer; `BlockTokens` sets their logits to -inf at every step.

Randomness: one generate call per rollout, on torch's RNG seeded with `PromptBatch.seeds[0]`
inside `torch.random.fork_rng`, so a rollout is reproducible from (run seed, step) and the
global RNG stream (saved in checkpoints) is left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from vlm.batch import collate, layout_for

VISION_TOKEN_KEYS = ("image_token_id", "image_token_index", "video_token_id", "vision_start_token_id",
                     "vision_end_token_id", "boi_token_id", "eoi_token_id", "boi_token_index", "eoi_token_index",
                     "audio_token_id")


def stop_token_ids(hf, tokenizer) -> list[int]:
    """EOS ids of the generation config and the tokenizer (a completion ends at the first one)."""
    ids = hf.generation_config.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model has no EOS token (generation_config.eos_token_id and tokenizer.eos_token)")
    return ids


def blocked_token_ids(hf, tokenizer, stop_ids: list[int], allowed: list[str] = ()) -> list[int]:
    """Token ids generation must never emit (`allowed`: special tokens to keep, e.g. Qwen2-VL's <|box_start|>)."""
    blocked = {int(i) for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    blocked |= {int(i) for i in tokenizer.all_special_ids}
    for key in VISION_TOKEN_KEYS:
        value = getattr(hf.config, key, None)
        if isinstance(value, int) and value >= 0:
            blocked.add(value)
    vocab = hf.get_output_embeddings().weight.shape[0]
    blocked |= set(range(len(tokenizer), vocab))                      # rows with no token behind them
    keep = set(stop_ids)
    for token in allowed:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
            raise ValueError(f"config key 'policy.allowed_special_tokens': {token!r} is not a token of this tokenizer")
        if token_id in (getattr(hf.config, k, None) for k in VISION_TOKEN_KEYS):
            raise ValueError(f"config key 'policy.allowed_special_tokens': {token!r} is an image/video token")
        keep.add(token_id)
    return sorted(blocked - keep)


class BlockTokens(LogitsProcessor):
    def __init__(self, ids: list[int]):
        self.ids = torch.tensor(ids, dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, self.ids.to(scores.device)] = -float("inf")        # [B, V]
        return scores


@dataclass(frozen=True)
class SamplingSpec:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


def _trim(row: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, bool]:
    """The completion up to and including its first stop token; (tokens, ended_with_stop)."""
    hits = torch.isin(row, torch.tensor(stop_ids, device=row.device)).nonzero()
    if hits.numel():
        return row[:int(hits[0]) + 1].cpu(), True
    return row.cpu(), False


class HFBackend:
    """Generation with the (unwrapped) Hugging Face model itself."""

    def __init__(self, hf, tokenizer, pad_id: int, image_token_id: int | None, blocked: list[int],
                 stop_ids: list[int], rows_per_call: int = 0):
        self.hf, self.tokenizer, self.pad_id, self.image_token_id = hf, tokenizer, pad_id, image_token_id
        self.blocked, self.stop_ids, self.rows_per_call = blocked, stop_ids, rows_per_call

    def before_rollout(self, parts, step: int) -> None:
        """Nothing to synchronise: generation runs on the trained module itself."""

    def _kwargs(self, spec: SamplingSpec) -> dict:
        kw = dict(max_new_tokens=spec.max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                  repetition_penalty=1.0, logits_processor=LogitsProcessorList([BlockTokens(self.blocked)]),
                  use_cache=True, do_sample=not spec.greedy)
        if not spec.greedy:  # explicit values: checkpoints ship generation configs with e.g. top_k=1
            kw.update(temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k)
        return kw

    @torch.no_grad()
    def sample(self, rows: list, spec: SamplingSpec, seed: int, device) -> tuple[list[torch.Tensor], list[bool]]:
        """One completion per row (rows repeat a prompt G times for a group)."""
        step = self.rows_per_call or len(rows)
        completions, ended = [], []
        devices = [device] if torch.device(device).type == "cuda" else []
        was_training = self.hf.training
        self.hf.eval()
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for lo in range(0, len(rows), step):
                chunk = rows[lo:lo + step]
                batch = collate(chunk, None, layout_for(chunk, None), self.pad_id, self.image_token_id, device)
                out = self.hf.generate(**batch, **self._kwargs(spec))                 # [B, P + new]
                for row in out[:, batch["input_ids"].shape[1]:]:
                    tokens, stop = _trim(row, self.stop_ids)
                    completions.append(tokens)
                    ended.append(stop)
        self.hf.train(was_training)
        return completions, ended
