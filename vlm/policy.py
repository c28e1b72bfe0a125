"""The VLM policy (`policy.name: vlm`): an image-text-to-text model as a sampler with a log-likelihood.

Two policies share the model's parts (`VLMCommon`): `VLMPolicy`, single-turn (below), and the agent policy of a
run with an `env:` section (`vlm.agent.AgentPolicy`, multi-turn episodes); `build` picks one.

An action is a generated token; T is the longest completion of a rollout. One rollout:
  1. records -> `PromptInputs` (images decoded and resized lazily, chat template, truncation),
     in a torch DataLoader with `image_workers` processes;
  2. each prompt's images are encoded once (`vlm.features`), the image-token invariant checked;
  3. the backend samples G completions per prompt (HF generate, or vLLM), blocked tokens never emitted,
     sample j of prompt i seeded from `PromptBatch.seeds[i]` and j only (`vlm.generation.sample_seed`);
  4. old log-probs come from `TokenScorer` (the same forward training uses), per recorded layout:
     by default the update takes them from its own first forward (`old_log_probs: deferred`, see
     `mmrl.loop.update`), so a one-epoch GRPO step runs no separate scoring forward; with
     `old_log_probs: rollout` the rollout scores its samples without grad.
The trainer replaces `self.model` (the TokenScorer) with its prepared wrapper; generation and
no-grad scoring use the unwrapped module.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import os
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from safetensors.torch import load_file, save_file

from mmrl.types import PromptBatch, Reference, Rollout, Scores
from rewards.sample import Sample
from vlm.batch import Layout, layout_for
from vlm.features import encode
from vlm.generation import SamplingSpec
from vlm.prompts import check_image_tokens
from vlm.rows import prepare_rows
from vlm.setup import Parts, build_parts
from vlm.setup import validate as validate_section


@dataclass(frozen=True)
class LoraSection:
    rank: int = 0                 # LoRA rank; 0 = full fine-tuning
    alpha: int = 64
    dropout: float = 0.0          # active only in train mode (gradient_checkpointing); > 0 breaks ratio == 1
    target_modules: List[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


@dataclass(frozen=True)
class VLLMSection:
    gpu_memory_utilization: float = 0.5   # fraction of GPU memory vLLM may take (weights + KV cache)
    tensor_parallel_size: int = 1
    max_model_len: int = 0                # 0 = max_prompt_tokens + max_new_tokens
    enforce_eager: bool = False           # no CUDA graphs (slower, starts faster)
    sleep: bool = False                   # sleep the engine during updates (frees its memory; GPU only)
    cpu_kv_cache_gib: int = 1             # VLLM_CPU_KVCACHE_SPACE on CPU-only machines
    max_images_per_prompt: int = 4        # limit_mm_per_prompt for images


@dataclass(frozen=True)
class Config:
    name: str = "vlm"
    model: str = ""                       # hub id, local folder, or tiny:<family> (vlm/tiny.py, built offline)
    processor: Optional[str] = None       # processor source; None = `model`
    dtype: str = "auto"                   # auto | fp32 | bf16 | fp16 weights (auto: bf16 only for a LoRA base on GPU under precision=bf16)
    attn_implementation: Optional[str] = None  # sdpa | eager | flash_attention_2; None = transformers' default
    # images
    min_pixels: int = 3136                # W*H bounds of each input image after resizing (Qwen2-VL smart_resize)
    max_pixels: int = 1003520             # 1280 * 28 * 28
    image_factor: int = 0                 # sides become multiples of it; 0 = the processor's patch_size * merge_size (28 for Qwen2.5-VL), else 1
    image_root: Optional[str] = None      # folder for relative image paths of rows not loaded by vlm.data:load
    image_workers: int = 0                # DataLoader worker processes that decode, resize and tokenize prompts
    # prompts
    system_prompt: Optional[str] = None   # system message (a row's `system` column wins)
    format_prompt: str = "r1"             # r1 (append the <think>/<answer> instruction) | none | a template with {prompt}
    max_prompt_tokens: int = 2048
    truncation: str = "error"             # error | left (drop the earliest text tokens; image/special tokens are never cut)
    require_answer: bool = True           # rows without `answer` are errors
    # generation
    backend: str = "hf"                   # hf (transformers generate) | vllm (optional extra)
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                        # 0 = off
    share_prefix_generation: bool = True  # prefill each prompt once, decode its G rows from copies of its KV cache (vlm.prefix; verified models)
    cache_turns: bool = True              # episodes with env.history_turns=null: each trajectory keeps its KV cache across turns and prefills only the new tokens (vlm.turn_cache; HF backend, verified models)
    generate_rows_per_call: int = 0       # rows per generate call; 0 = one prompt's G rows (> G: whole prompts, left-padded together: faster, no longer split-independent to the bit; mmrl.distributed.determinism)
    eval_max_new_tokens: int = 0          # greedy evaluation length; 0 = max_new_tokens
    allowed_special_tokens: List[str] = field(default_factory=list)  # special tokens generation may emit (all others but EOS are blocked)
    # scoring and training
    old_log_probs: str = "deferred"       # deferred (the update takes them from its own forward; no rollout-time scoring) | rollout
    share_prefix_scoring: bool = True     # each prompt's prefix runs once per forward for all its rows, with grad (vlm.prefix)
    pack_sequences: bool = True           # rows not sharing a prefix scored padding-free in one packed forward (vlm.packing)
    score_rows_per_call: int = 8          # rows per no-grad scoring forward at rollout time (old_log_probs: rollout)
    logprob_chunk: int = 128              # positions per fp32 log-softmax chunk
    lora: LoraSection = field(default_factory=LoraSection)
    freeze_vision: bool = True            # freeze the vision tower and projector; features are then cached per prompt
    gradient_checkpointing: bool = False
    cpu_threads: int = 0                  # torch intra-op threads when on CPU; 0 = torch's default (1 avoids OpenMP spin-waits on busy cores)
    reference: str = "auto"               # KL reference: auto (adapter for LoRA, reload otherwise) | adapter | reload | none
    vllm: VLLMSection = field(default_factory=VLLMSection)


class VLMCommon(abc.ABC):
    """What the single-turn policy (`VLMPolicy`) and the agent policy (`vlm.agent.AgentPolicy`) share: the model
    and its parts (`vlm.setup.Parts`), sampling under autocast with gathered weights, training log-probs and the
    reference's, and the weights (save, load, export). A subclass says how it samples (`_rollout`,
    `_generate_eval`) and how it scores its rollouts (`_score_with`)."""

    def __init__(self, cfg: Config, ctx, parts: Parts):
        self.cfg, self.ctx, self.device = cfg, ctx, ctx.device
        self.p = parts
        self.scorer = parts.scorer
        self.model = parts.scorer                       # the trainer may wrap it
        self._ref = None

    def _autocast(self):
        acc = self.ctx.accelerator
        return acc.autocast() if acc is not None else contextlib.nullcontext()

    def _sampling(self) -> SamplingSpec:
        return SamplingSpec(self.cfg.max_new_tokens, self.cfg.temperature, self.cfg.top_p, self.cfg.top_k)

    def _greedy(self) -> SamplingSpec:
        return SamplingSpec(self.cfg.eval_max_new_tokens or self.cfg.max_new_tokens, greedy=True)

    def interrupt_with(self, check) -> None:
        """Interruptible (`mmrl.types.Interruptible`) on the HF backend: a reply stops at a token boundary when newer
        weights arrive and goes on under them (`vlm.generation`); an agent's next reply also starts with the newest
        weights (between turns). The log-probs are then left to the worker, which scores each token under the
        weights that produced it (`Rollout.versions`)."""
        if check is not None and self.cfg.backend != "hf":
            raise ValueError(f"policy.backend={self.cfg.backend}: interruptible rollouts need the hf backend")
        self.p.backend.check = check

    # ---------------------------------------------------------------- sampling
    def on_shard(self) -> None:
        """After the trainer sharded `self.model` (distributed.strategy=fsdp): with distributed.rollout=sharded
        HF generate keeps the ranks in lockstep (each block is gathered per forward)."""
        if hasattr(self.p.backend, "synced"):
            self.p.backend.synced = self.ctx.rollout == "sharded"

    def _gathered(self):
        """Sampling with sharded weights (`mmrl.distributed.sharding.gathered`); nothing when the model is not
        sharded."""
        from mmrl.distributed.sharding import gathered

        return gathered(self.scorer, mode=self.ctx.rollout)

    def weights_loaded(self, version: int) -> None:
        """`mmrl.types.SamplesWithACopy`: an asynchronous rollout worker loaded the learner's version `version`; the
        vLLM engine gets it before the next rollout (once per version, not once per plan)."""
        self._loaded_version = version

    def _before_sampling(self, step: int) -> None:
        """The backend's turn before a rollout or evaluation (vLLM: push the weights trained since the last, which
        the trainer's step identifies, or in a rollout worker the version it loaded); with sharded weights only the
        root's own are gathered, the blocks one at a time by the push."""
        from mmrl.distributed.sharding import gathered

        if self.cfg.backend == "hf":                      # generation runs on the trained module itself
            return
        loaded = getattr(self, "_loaded_version", None)
        with gathered(self.scorer, mode="sharded"):
            self.p.backend.before_rollout(self.p.model, step if loaded is None else ("version", loaded))

    def rollout(self, prompts: PromptBatch, group_size: int) -> Rollout:
        self._before_sampling(prompts.step)
        with self._gathered():
            return self._rollout(prompts, group_size)

    @torch.no_grad()
    def generate_eval(self, prompts: PromptBatch) -> list:
        """Greedy outputs, one per prompt (validation)."""
        self._before_sampling(prompts.step)
        with self._gathered():
            return self._generate_eval(prompts)

    @abc.abstractmethod
    def _rollout(self, prompts: PromptBatch, group_size: int) -> Rollout:
        """Sample G outputs per record of `prompts` (under the gathered weights)."""

    @abc.abstractmethod
    def _generate_eval(self, prompts: PromptBatch) -> list:
        """Greedy outputs, one per record of `prompts`."""

    @abc.abstractmethod
    def _score_with(self, scorer, rollout: Rollout, index: torch.Tensor):
        """(log-probs, entropies) [n, T] of the samples `index` with `scorer` (the trained or the reference one)."""

    # ---------------------------------------------------------------- scoring for training
    def log_probs(self, rollout: Rollout, index: torch.Tensor, reference: Reference | None = None) -> Scores:
        """Log-probs and entropies [n, T] with grad; `reference` is not needed (the core estimates the KL
        from `Reference.log_probs`)."""
        self.scorer.train(self.cfg.gradient_checkpointing)
        logp, entropy = self._score_with(self.model, rollout, index)                                # [n, T]
        return Scores(log_probs=logp, entropy=entropy)

    @torch.no_grad()
    def reference_log_probs(self, rollout: Rollout, index: torch.Tensor) -> Reference:
        """The reference model's log-probs [n, T] of the sampled tokens: the LoRA base (adapter disabled) or
        the pretrained weights reloaded on first use (never loaded when algo.kl_beta is 0)."""
        mode = self.p.reference.mode
        if mode == "none":
            raise ValueError("algo.kl_beta != 0 needs a reference model, but policy.reference=none")
        with self._autocast():
            if mode == "adapter":
                with self.p.model.peft.disable_adapter():
                    logp, _ = self._score_with(self.scorer, rollout, index)
                return Reference(log_probs=logp)
            if self._ref is None:
                self._ref = self.p.reference.load()
                if self.ctx.shard is not None:              # distributed.strategy=fsdp: a sharded frozen copy
                    self.ctx.shard(self._ref)
            logp, _ = self._score_with(self._ref, rollout, index)
        return Reference(log_probs=logp)

    # ---------------------------------------------------------------- weights and evaluation
    def trainable_parameters(self):
        return [p for p in self.p.model.hf.parameters() if p.requires_grad]

    def _trainable(self) -> dict:
        return {n: p for n, p in self.p.model.hf.named_parameters() if p.requires_grad}

    def save(self, path: str) -> None:
        save_file({n: p.detach().cpu().contiguous() for n, p in self._trainable().items()}, path)

    def load(self, path: str) -> None:
        state, params = load_file(path), self._trainable()
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or extra:
            raise ValueError(f"{path}: trainable weights do not match this policy (missing {missing[:3]}, "
                             f"unexpected {extra[:3]}); was it saved with the same policy.lora / freeze_vision?")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(state[n].to(p.device, p.dtype))

    def export(self, folder: str) -> None:
        """The model in transformers' / peft's own folders, each with the processor: full fine-tuning a
        `save_pretrained` model folder (`AutoModelForImageTextToText.from_pretrained`); LoRA the peft adapter
        (`PeftModel.from_pretrained(base, folder)`) and `merged/`, a copy with the adapter merged into the base."""
        m = self.p.model
        if m.peft is None:
            m.hf.save_pretrained(folder)
        else:
            m.peft.save_pretrained(folder)
            merged = os.path.join(folder, "merged")
            copy.deepcopy(m.peft).merge_and_unload().save_pretrained(merged)   # the live adapter stays unmerged
            m.processor.save_pretrained(merged)
        m.processor.save_pretrained(folder)


def padded_versions(per_row: list, t: int) -> torch.Tensor:
    """[N, T] version of each token from each row's [t_i] (padding repeats the row's last version)."""
    out = torch.zeros(len(per_row), t, dtype=torch.long)
    for i, v in enumerate(per_row):
        out[i, :len(v)] = v
        out[i, len(v):] = v[-1] if len(v) else 0
    return out


class VLMPolicy(VLMCommon):
    """The single-turn policy: G completions per prompt record; an action is a generated token.
    Scored rollouts hold per row the prompt, the completion ids and the layout (`vlm.batch.Layout`)."""

    @torch.no_grad()
    def _prompts(self, prompts: PromptBatch) -> list:
        items = prepare_rows(prompts, self.p.builder, self.cfg.image_workers)
        with self._autocast():
            for x in items:
                x.features = encode(self.p.model.hf, x.encoder_inputs, self.device)
                check_image_tokens(x, self.p.tokens.image_token_id)
                if self.cfg.freeze_vision:
                    x.encoder_inputs = {}               # pixels are not needed again
        return items

    @torch.no_grad()
    def _score(self, rows: list, completions: list, layout: Layout) -> torch.Tensor:
        """Old log-probs [N, T] at rollout time, in chunks of score_rows_per_call rows."""
        t, step = layout.width - layout.prompt_width, self.cfg.score_rows_per_call
        self.scorer.train(self.cfg.gradient_checkpointing)
        parts = []
        with self._autocast():
            for lo in range(0, len(rows), step):
                sl = slice(lo, lo + step)
                lp, _ = self.scorer(rows[sl], completions[sl], [layout] * len(rows[sl]), t)
                parts.append(lp)
        return torch.cat(parts)

    def _samples(self, rows, completions, ended, prompts: PromptBatch, group_size: int, tag: str) -> list:
        texts = self.p.model.tokenizer.batch_decode(completions, skip_special_tokens=True)
        out = []
        for i, (x, c, text, done) in enumerate(zip(rows, completions, texts, ended)):
            p, g = divmod(i, group_size)
            meta = {**x.meta, "resize": x.resize, "num_tokens": int(c.numel()), "completion_ids": c.tolist(),
                    "finished": bool(done), "prompt_truncated": x.truncated}
            out.append(Sample(prompt=x.text, output=text, images=x.images, answer=x.row.get("answer"), meta=meta,
                              id=f"{tag} prompt {prompts.index[p]} sample {g}"))
        return out

    def _rollout(self, prompts: PromptBatch, group_size: int) -> Rollout:
        items = self._prompts(prompts)
        rows = [x for x in items for _ in range(group_size)]                                 # N
        completions, ended = self.p.backend.sample(items, group_size, self._sampling(), prompts.seeds, self.device)
        layout = layout_for(rows, completions)
        t = layout.width - layout.prompt_width
        lengths = torch.tensor([c.numel() for c in completions], device=self.device)
        mask = (torch.arange(t, device=self.device)[None, :] < lengths[:, None]).float()      # [N, T]
        interrupted = getattr(self.p.backend, "last_versions", None)          # [t] per row: interruptible
        logp = None                                                          # deferred, or scored per version
        if self.cfg.old_log_probs == "rollout" and interrupted is None:
            logp = self._score(rows, completions, layout)                    # [N, T]
        versions = None if interrupted is None else padded_versions(interrupted, t)  # [N, T]
        n = len(rows)
        return Rollout(
            samples=self._samples(rows, completions, ended, prompts, group_size, f"step {prompts.step}"),
            log_probs=logp, mask=mask, group=torch.arange(len(items)).repeat_interleave(group_size),
            state={"prompt": rows, "completion": completions,
                   "prompt_width": torch.full((n,), layout.prompt_width, dtype=torch.long),
                   "width": torch.full((n,), layout.width, dtype=torch.long)},
            engine_log_probs=self._engine_log_probs(n, t), versions=versions)

    def _engine_log_probs(self, n: int, t: int) -> torch.Tensor | None:
        """[N, T] vLLM's own log-probs of the sampled tokens (NaN where it reported none: a stop token it left
        out), for the rollout correction (`mmrl.algorithms.rollout_correction`); None on the HF backend."""
        if self.cfg.backend != "vllm":
            return None
        out = torch.full((n, t), float("nan"), device=self.device)
        for i, lp in enumerate(self.p.backend.last_logprobs):
            out[i, :min(lp.numel(), t)] = lp[:t].to(out)
        return out

    def _score_with(self, scorer, rollout: Rollout, index: torch.Tensor):
        prompts, comps, layouts = self._rows(rollout, index)
        return scorer(prompts, comps, layouts, rollout.mask.shape[1])

    def _rows(self, rollout: Rollout, index: torch.Tensor):
        idx = index.tolist()
        st = rollout.state
        layouts = [Layout(int(st["prompt_width"][i]), int(st["width"][i])) for i in idx]
        return [st["prompt"][i] for i in idx], [st["completion"][i] for i in idx], layouts

    def _generate_eval(self, prompts: PromptBatch) -> list:
        items = self._prompts(prompts)
        completions, ended = self.p.backend.sample(items, 1, self._greedy(), prompts.seeds, self.device)
        return self._samples(items, completions, ended, prompts, 1, "eval")


def validate(cfg: Config) -> None:
    """Checks of the `policy:` section that need no model (run when the config is loaded)."""
    validate_section(cfg)
    if cfg.cpu_threads < 0:
        raise ValueError(f"config key 'policy.cpu_threads' must be >= 0 (0 = torch's default), got {cfg.cpu_threads}")


def validate_rollout_correction(cfg: Config, algo) -> None:
    """algo.rollout_correction weighs vLLM's samples by pi_trainer / pi_vllm: it needs backend vllm."""
    if cfg.backend != "vllm":
        raise ValueError(f"config key 'algo.rollout_correction.mode' is {algo.rollout_correction.mode}, but "
                         f"policy.backend is {cfg.backend!r}: HF generate samples with the trained forward itself (no "
                         "mismatch); use policy.backend=vllm, or algo.rollout_correction.mode=none")


def validate_episodes(cfg: Config, env) -> None:
    """Checks of the policy section for multi-turn episodes (`env:`), run when the config is loaded."""
    if cfg.backend != "hf":
        raise ValueError(f"config key 'policy.backend': multi-turn episodes (env section) run on the hf backend; "
                         f"{cfg.backend!r} is not supported for them yet")


def build_team(policies: dict, roles: dict, env_cfg, device):
    """The policies (name -> `vlm.agent.AgentPolicy`) playing a multi-role environment (`vlm.roles.Team`)."""
    from vlm.roles import Team

    return Team(policies, roles, env_cfg, device)


def build(cfg: Config, ctx) -> VLMCommon:
    """The agent policy (`vlm.agent`) when the run has an `env:` section, else the single-turn policy."""
    validate(cfg)
    if cfg.cpu_threads and torch.device(ctx.device).type == "cpu":
        torch.set_num_threads(cfg.cpu_threads)
    if ctx.kl_beta != 0 and cfg.reference == "none":
        raise ValueError("algo.kl_beta != 0 needs a reference model, but policy.reference=none "
                         "(set policy.reference=auto or algo.kl_beta=0)")
    if ctx.env is not None:                          # multi-turn agent
        from vlm.agent import AgentPolicy

        return AgentPolicy(cfg, ctx, build_parts(cfg, ctx))
    return VLMPolicy(cfg, ctx, build_parts(cfg, ctx))
