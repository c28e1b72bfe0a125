"""Build the parts of a VLM policy from its config: the loaded model, its special tokens, the prompt
builder, the scorer, the generation backend and the KL reference."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from vlm.features import base_model
from vlm.generation import HFBackend, blocked_token_ids, stop_token_ids
from vlm.images import ResizePolicy
from vlm.logprobs import TokenScorer
from vlm.model import load_model, load_processor, setup_training, weight_dtype
from vlm.prompts import InputKeys, PromptBuilder, PromptOptions


@dataclass(frozen=True)
class Model:
    """The loaded model and its processor."""

    hf: object                    # the transformers model (LoRA layers injected in place)
    peft: object                  # the PeftModel wrapper, or None for full fine-tuning
    processor: object
    tokenizer: object


@dataclass(frozen=True)
class Tokens:
    """The special token ids generation, batching and scoring agree on."""

    image_token_id: int | None    # the image placeholder, None for a model without one
    pad_id: int
    stop_ids: list                # generation ends at any of these
    blocked: list                 # never sampled (special tokens other than stops and policy.allowed_special_tokens)


@dataclass(frozen=True)
class KLReference:
    """Where the KL reference log-probs come from (`policy.reference`, `auto` resolved)."""

    mode: str                     # adapter (the LoRA base) | reload | none
    load: Callable                # () -> a frozen TokenScorer on the pretrained weights (reload mode)


@dataclass(frozen=True)
class Parts:
    """Everything `vlm.policy.VLMPolicy` runs on."""

    model: Model
    tokens: Tokens
    builder: PromptBuilder
    scorer: TokenScorer
    backend: object               # HFBackend | vlm.vllm_backend.VLLMBackend
    reference: KLReference


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
        (cfg.generate_rows_per_call >= 0, "policy.generate_rows_per_call", "must be >= 0 (0 = one prompt's G rows)"),
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


def _tokens(hf, tokenizer, cfg) -> Tokens:
    stop_ids = stop_token_ids(hf, tokenizer)
    blocked = blocked_token_ids(hf, tokenizer, stop_ids, list(cfg.allowed_special_tokens))
    return Tokens(getattr(hf.config, "image_token_id", None), _pad_id(hf, tokenizer, stop_ids), stop_ids, blocked)


def _input_keys(hf) -> InputKeys:
    base = base_model(hf)
    return InputKeys(frozenset(inspect.signature(base.get_image_features).parameters),
                     frozenset(inspect.signature(base.forward).parameters))


def _scorer(hf, tokens: Tokens, cfg) -> TokenScorer:
    return TokenScorer(hf, tokens.blocked, cfg.temperature, cfg.logprob_chunk, tokens.pad_id, tokens.image_token_id,
                       not cfg.freeze_vision, share_prefix=cfg.share_prefix_scoring,
                       pack=cfg.pack_sequences)


def _backend(cfg, ctx, model: Model, tokens: Tokens, image_kwargs: dict):
    if cfg.backend == "vllm":
        from vlm.vllm_backend import VLLMBackend

        return VLLMBackend(cfg, model.hf, model.processor, tokens.blocked, tokens.stop_ids, ctx, image_kwargs,
                           tokens.image_token_id)
    return HFBackend(model.hf, model.tokenizer, tokens.pad_id, tokens.image_token_id, tokens.blocked,
                     tokens.stop_ids, cfg.generate_rows_per_call, share_prefix=cfg.share_prefix_generation)


def build_parts(cfg, ctx) -> Parts:
    validate(cfg)
    processor = load_processor(cfg)
    tokenizer = getattr(processor, "tokenizer", processor)
    lora = cfg.lora.rank > 0
    dtype = weight_dtype(cfg.dtype, ctx.precision, ctx.device, lora)
    hf = load_model(cfg, ctx.device, dtype)
    model = Model(hf, setup_training(hf, cfg), processor, tokenizer)
    tokens = _tokens(hf, tokenizer, cfg)
    resize, image_kwargs = _resize_policy(cfg, processor)
    protected = frozenset(tokens.blocked) | frozenset(tokens.stop_ids)
    builder = PromptBuilder(processor, resize, _input_keys(hf), protected, PromptOptions.from_config(cfg),
                            image_kwargs)
    scorer = _scorer(hf, tokens, cfg)
    backend = _backend(cfg, ctx, model, tokens, image_kwargs)

    def reload() -> TokenScorer:
        return _scorer(load_model(cfg, ctx.device, dtype).requires_grad_(False).eval(), tokens, cfg)

    mode = {"auto": "adapter" if lora else "reload"}.get(cfg.reference, cfg.reference)
    return Parts(model, tokens, builder, scorer, backend, KLReference(mode, reload))
