"""Build the parts of a VLM policy from its config: processor, model, prompt builder, scorer,
generation backend, KL reference; and the DataLoader that prepares a rollout's prompts."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from mmrl.config import ConfigError
from vlm.features import base_model
from vlm.generation import HFBackend, blocked_token_ids, stop_token_ids
from vlm.images import ResizePolicy
from vlm.logprobs import TokenScorer
from vlm.model import load_model, load_processor, setup_training, weight_dtype
from vlm.prompts import PromptBuilder
from vlm.data import ROW_KEY, SOURCE_KEY


@dataclass
class Parts:
    hf: object                    # the transformers model (LoRA layers injected in place)
    peft: object                  # the PeftModel wrapper, or None for full fine-tuning
    processor: object
    tokenizer: object
    builder: PromptBuilder
    scorer: TokenScorer
    backend: object               # HFBackend | vlm.vllm_backend.VLLMBackend
    image_token_id: int | None
    pad_id: int
    stop_ids: list
    blocked: list
    reference_mode: str           # adapter | reload | none
    reference_scorer: Callable    # () -> a frozen TokenScorer on the pretrained weights (reload mode)


def validate(cfg) -> None:
    """Cross-field checks of the `policy:` section; errors name the key."""
    checks = [
        (bool(cfg.model), "policy.model", "is empty: name a hub id, a local folder or tiny:qwen2_5_vl"),
        (cfg.backend in ("hf", "vllm"), "policy.backend", f"must be hf or vllm, got {cfg.backend!r}"),
        (cfg.truncation in ("error", "left"), "policy.truncation", f"must be error or left, got {cfg.truncation!r}"),
        (cfg.reference in ("auto", "adapter", "reload", "none"), "policy.reference",
         f"must be auto, adapter, reload or none, got {cfg.reference!r}"),
        (cfg.reference != "adapter" or cfg.lora.rank > 0, "policy.reference", "adapter needs policy.lora.rank > 0"),
        (cfg.format_prompt in ("r1", "none") or "{prompt}" in cfg.format_prompt, "policy.format_prompt",
         "must be r1, none, or a template containing {prompt}"),
        (cfg.max_new_tokens >= 1, "policy.max_new_tokens", "must be >= 1"),
        (cfg.max_prompt_tokens >= 1, "policy.max_prompt_tokens", "must be >= 1"),
        (cfg.temperature > 0, "policy.temperature", "must be > 0"),
        (0 < cfg.top_p <= 1, "policy.top_p", "must be in (0, 1]"),
        (cfg.top_k >= 0, "policy.top_k", "must be >= 0 (0 = off)"),
        (0 < cfg.min_pixels <= cfg.max_pixels, "policy.min_pixels", "must be > 0 and <= policy.max_pixels"),
        (cfg.image_factor >= 0, "policy.image_factor", "must be >= 0 (0 = from the processor)"),
        (cfg.image_workers >= 0, "policy.image_workers", "must be >= 0"),
        (cfg.score_rows_per_call >= 1, "policy.score_rows_per_call", "must be >= 1"),
        (cfg.old_log_probs in ("deferred", "rollout"), "policy.old_log_probs",
         f"must be deferred or rollout, got {cfg.old_log_probs!r}"),
        (cfg.logprob_chunk >= 1, "policy.logprob_chunk", "must be >= 1"),
        (cfg.generate_rows_per_call >= 0, "policy.generate_rows_per_call", "must be >= 0 (0 = all rows)"),
        (cfg.lora.rank >= 0, "policy.lora.rank", "must be >= 0 (0 = full fine-tuning)"),
    ]
    for ok, key, message in checks:
        if not ok:
            raise ValueError(f"config key '{key}' {message}")


def _resize_policy(cfg, processor) -> tuple[ResizePolicy, dict]:
    """The image policy and the processor call kwargs that keep the processor from resizing again."""
    ip = getattr(processor, "image_processor", None)
    factor = cfg.image_factor
    if not factor:
        patch, merge = getattr(ip, "patch_size", None), getattr(ip, "merge_size", None)
        factor = patch * merge if isinstance(patch, int) and isinstance(merge, int) else 1
    size = dict(getattr(ip, "size", None) or {})
    kwargs = {}
    if "longest_edge" in size and "shortest_edge" in size and hasattr(ip, "merge_size"):  # Qwen-VL pixel bounds
        kwargs["size"] = {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}
    return ResizePolicy(factor, cfg.min_pixels, cfg.max_pixels), kwargs


def _pad_id(hf, tokenizer, stop_ids: list) -> int:
    for value in (tokenizer.pad_token_id, hf.generation_config.pad_token_id):
        if isinstance(value, int):
            return value
    return stop_ids[0]


def build_parts(cfg, ctx) -> Parts:
    validate(cfg)
    processor = load_processor(cfg)
    tokenizer = getattr(processor, "tokenizer", processor)
    lora = cfg.lora.rank > 0
    dtype = weight_dtype(cfg.dtype, ctx.precision, ctx.device, lora)
    hf = load_model(cfg, ctx.device, dtype)
    peft_model = setup_training(hf, cfg)
    stop_ids = stop_token_ids(hf, tokenizer)
    blocked = blocked_token_ids(hf, tokenizer, stop_ids, list(cfg.allowed_special_tokens))
    pad_id = _pad_id(hf, tokenizer, stop_ids)
    image_token_id = getattr(hf.config, "image_token_id", None)
    base = base_model(hf)
    resize, image_kwargs = _resize_policy(cfg, processor)
    builder = PromptBuilder(
        processor, resize, frozenset(inspect.signature(base.get_image_features).parameters),
        frozenset(inspect.signature(base.forward).parameters), frozenset(blocked) | frozenset(stop_ids),
        cfg.system_prompt, cfg.format_prompt, cfg.max_prompt_tokens, cfg.truncation, cfg.image_root,
        cfg.require_answer, image_kwargs)
    fresh = not cfg.freeze_vision
    scorer = TokenScorer(hf, blocked, cfg.temperature, cfg.logprob_chunk, pad_id, image_token_id, fresh)
    if cfg.backend == "vllm":
        from vlm.vllm_backend import VLLMBackend

        backend = VLLMBackend(cfg, hf, processor, blocked, stop_ids, ctx, image_kwargs, image_token_id)
    else:
        backend = HFBackend(hf, tokenizer, pad_id, image_token_id, blocked, stop_ids, cfg.generate_rows_per_call)
    mode = {"auto": "adapter" if lora else "reload"}.get(cfg.reference, cfg.reference)

    def reference_scorer() -> TokenScorer:
        ref = load_model(cfg, ctx.device, dtype).requires_grad_(False).eval()
        return TokenScorer(ref, blocked, cfg.temperature, cfg.logprob_chunk, pad_id, image_token_id, fresh)

    return Parts(hf, peft_model, processor, tokenizer, builder, scorer, backend, image_token_id, pad_id,
                 stop_ids, blocked, mode, reference_scorer)


class _Rows(torch.utils.data.Dataset):
    """A rollout's rows; items are `PromptInputs`, or the error a bad row raised (re-raised by the caller)."""

    def __init__(self, rows: list, builder: PromptBuilder):
        self.rows, self.builder = rows, builder

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        try:
            return self.builder(self.rows[i])
        except ConfigError as e:
            return e


def _identity(item):
    return item


def prepare_rows(prompts, builder: PromptBuilder, workers: int) -> list:
    """`PromptInputs` for every row of a PromptBatch (provenance tagged for error messages)."""
    source = "data.eval" if prompts.step < 0 else "data.train"
    rows = [{SOURCE_KEY: source, ROW_KEY: i, **row} for row, i in zip(prompts.rows, prompts.index)]
    dataset = _Rows(rows, builder)
    if workers > 0 and len(rows) > 1:
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False,
                                             num_workers=min(workers, len(rows)), collate_fn=_identity)
        items = list(loader)
    else:
        items = [dataset[i] for i in range(len(dataset))]
    for item in items:
        if isinstance(item, Exception):
            raise item
    return items
