"""Hugging Face `generate` backend: sampled (rollout) or greedy (evaluation) completions.

Blocked tokens: a random-init or drifting model happily samples `<|image_pad|>` and other
special tokens, after which re-scoring fails with "Image features and image tokens do not
match" (the number of placeholder tokens must equal the number of image feature rows, as the
Qwen2-VL forward checks). EasyR1 (github.com/hiyouga/EasyR1) blocks them with a logit bias;
here `blocked_token_ids` lists every special token except the stop tokens, plus the config's
vision token ids and any embedding rows past the tokenizer, and `BlockTokens` sets their logits
to -inf at every step.

Randomness: sample j of a prompt whose seed is s draws from its own generator, seeded with
`sample_seed(s, j)`: `SeededSampler` picks each row's next token by inverse-CDF sampling with one
uniform of that row's generator per step, then leaves only that token finite, so `generate` runs
greedy decoding and emits it (the same distribution as transformers' multinomial sampling after
the same temperature / top-k / top-p warpers). A row's draws never depend on the rows decoded
beside it, and torch's global RNG (saved in checkpoints) is never touched. Each generate call
holds the rows of one prompt only (by default all its G rows), so no prompt is padded against
another and a prompt's completions are bit-identical however the step's prompts are split over
processes; `generate_rows_per_call` > G packs whole prompts into one left-padded call (same
random draws, tokens equal up to the rounding of attention over a different padded width).

Interruptible rollouts (`asynchronous.interrupt`, `mmrl.types.Interruptible`): with a `check` installed, every
sampled token is followed by `check()`, which may load newer weights; when it did, the call stops at that token
boundary and the unfinished rows go on from their prompt plus what they have sampled, under the new weights,
with their own generators (no draw is repeated or skipped) and the remaining token budget. The prefix is
prefilled again with the new weights (AReaL discards the old key/value cache likewise), so each token is what
the weights that produced it sample given everything before it; `last_versions` holds each token's version.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from vlm.batch import collate, layout_for
from vlm.prefix import decode, reason_unshared
from vlm.prompts import PromptInputs

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


def sample_seed(seed: int, j: int) -> int:
    """Seed of sample j of a prompt seeded `seed`. Prompt seeds are consecutive over positions, so they
    are spread first; samples of a prompt get consecutive seeds, as vLLM gives the n samples of a request."""
    return (seed * 1_000_003) % 2**62 + j


class SeededSampler(LogitsProcessor):
    """Sample each row's next token from softmax(scores) with the row's own generator; return scores
    that are 0 at that token and -inf elsewhere (greedy decoding then emits it).

    Inverse CDF in fp64: the token is the first whose cumulative probability exceeds u * total, u one
    uniform of the row's generator per step; a token of probability 0 is never the first to exceed it.
    """

    def __init__(self, generators: list[torch.Generator]):
        self.generators = generators

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in self.generators])   # [B]
        cdf = torch.softmax(scores.double(), dim=-1).cumsum(-1)                                      # [B, V]
        total = cdf[:, -1:]                                                                          # [B, 1]
        below = torch.nextafter(total, torch.zeros_like(total))
        target = torch.minimum(u.to(cdf.device)[:, None] * total, below)                             # [B, 1]
        token = torch.searchsorted(cdf, target, right=True)                                          # [B, 1]
        return torch.full_like(scores, -float("inf")).scatter_(1, token, 0.0)                        # [B, V]


class WeightsChanged(StoppingCriteria):
    """Stops every row of a generate call at the first token boundary where `check()` (which may load newer
    weights) returns a version other than `version`; `now` is the version it returned last."""

    def __init__(self, check, version: int):
        self.check, self.version, self.now = check, version, version

    def poll(self) -> bool:
        """Call `check` (at a token boundary); whether the weights changed since the call began."""
        self.now = self.check()
        return self.changed

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.poll(), dtype=torch.bool, device=input_ids.device)

    @property
    def changed(self) -> bool:
        return self.now != self.version


def extend_prompt(prompt: PromptInputs, tokens: torch.Tensor) -> PromptInputs:
    """`prompt` followed by sampled text tokens [t] (their per-token inputs are text's: 0)."""
    tokens = tokens.to(prompt.input_ids)
    token_inputs = {k: torch.cat([v, v.new_zeros(len(tokens))]) for k, v in prompt.token_inputs.items()}
    return replace(prompt, input_ids=torch.cat([prompt.input_ids, tokens]), token_inputs=token_inputs)


def _trim(row: torch.Tensor, stop_ids: list[int]) -> tuple[torch.Tensor, bool]:
    """The completion up to and including its first stop token; (tokens, ended_with_stop)."""
    hits = torch.isin(row, torch.tensor(stop_ids, device=row.device)).nonzero()
    if hits.numel():
        return row[:int(hits[0]) + 1].cpu(), True
    return row.cpu(), False


def generate_calls(n_prompts: int, group_size: int, rows_per_call: int) -> list[list[tuple[int, int]]]:
    """The (prompt, sample) rows of each generate call: one prompt's rows per call, at most `rows_per_call`
    of them (0 = all G); or, when rows_per_call holds several whole groups, that many whole prompts."""
    per = rows_per_call or group_size
    if per <= group_size:
        return [[(p, j) for j in range(lo, min(lo + per, group_size))]
                for p in range(n_prompts) for lo in range(0, group_size, per)]
    k = per // group_size
    return [[(p, j) for p in range(lo, min(lo + k, n_prompts)) for j in range(group_size)]
            for lo in range(0, n_prompts, k)]


class HFBackend:
    """Generation with the (unwrapped) Hugging Face model itself."""

    def __init__(self, hf, tokenizer, pad_id: int, image_token_id: int | None, blocked: list[int],
                 stop_ids: list[int], rows_per_call: int = 0, share_prefix: bool = False):
        self.hf, self.tokenizer, self.pad_id, self.image_token_id = hf, tokenizer, pad_id, image_token_id
        self.blocked, self.stop_ids, self.rows_per_call = blocked, stop_ids, rows_per_call
        self.share_prefix = share_prefix   # policy.share_prefix_generation: prefill once per prompt (vlm.prefix)
        self.synced = False      # FSDP with per-block gathers (distributed.rollout=sharded): ranks decode in lockstep
        self.check = None        # interruptible rollouts: () -> the loaded weights' version, may load newer ones
        self.last_versions: list[torch.Tensor] | None = None   # the last `sample`'s [t] version of each token

    def before_rollout(self, parts, step: int) -> None:
        """Nothing to synchronise: generation runs on the trained module itself."""

    def _kwargs(self, spec: SamplingSpec, generators: list | None) -> dict:
        processors = [BlockTokens(self.blocked)]
        if generators is not None:  # the warpers transformers applies when sampling, in its order, then our draw
            if spec.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(spec.temperature))
            if spec.top_k:
                processors.append(TopKLogitsWarper(spec.top_k))
            if spec.top_p < 1.0:
                processors.append(TopPLogitsWarper(spec.top_p))
            processors.append(SeededSampler(generators))
        return dict(max_new_tokens=spec.max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                    repetition_penalty=1.0, logits_processor=LogitsProcessorList(processors), use_cache=True,
                    do_sample=False, temperature=None, top_p=None, top_k=None, synced_gpus=self.synced)

    def _shares(self) -> bool:
        """A verified model, and no lockstep decoding across ranks (FSDP's per-block gathers)."""
        return self.share_prefix and not self.synced and reason_unshared(self.hf) is None

    def _generate(self, rows: list, spec: SamplingSpec, generators: list | None, device, stop=None,
                  share: bool = True) -> list:
        """[(completion tokens, ended_with_stop)] per row; `stop`: a `WeightsChanged` ending the call early."""
        if share and self._shares():          # each distinct prompt prefilled once (vlm.prefix)
            distinct = list({id(x): x for x in rows}.values())
            where = {id(x): i for i, x in enumerate(distinct)}
            batch = collate(distinct, None, layout_for(distinct, None), self.pad_id, self.image_token_id, device)
            out = decode(self.hf, batch, torch.tensor([where[id(x)] for x in rows]),
                         self._kwargs(spec, generators)["logits_processor"], spec.max_new_tokens, self.stop_ids,
                         self.pad_id, stop=None if stop is None else stop.poll)
            return [_trim(row, self.stop_ids) for row in out]                          # out: [B, new]
        batch = collate(rows, None, layout_for(rows, None), self.pad_id, self.image_token_id, device)
        extra = {} if stop is None else {"stopping_criteria": StoppingCriteriaList([stop])}
        out = self.hf.generate(**batch, **self._kwargs(spec, generators), **extra)     # [B, P + new]
        return [_trim(row, self.stop_ids) for row in out[:, batch["input_ids"].shape[1]:]]

    def _interruptible(self, rows: list, spec: SamplingSpec, generators: list, device) -> list:
        """[(completion tokens, ended_with_stop, [t] version of each token)] per row, loading newer weights at
        token boundaries (`check`): each part a generate call of the rows still unfinished, from their prompt
        and what they sampled so far, with the tokens left of the budget."""
        version, n = self.check(), len(rows)
        parts, versions, ended = [[] for _ in range(n)], [[] for _ in range(n)], [False] * n
        live, budget, first = list(range(n)), spec.max_new_tokens, True
        while live and budget > 0:
            stop = WeightsChanged(self.check, version)
            part_rows = [rows[i] if first else extend_prompt(rows[i], torch.cat(parts[i])) for i in live]
            out = self._generate(part_rows, replace(spec, max_new_tokens=budget), [generators[i] for i in live],
                                 device, stop=stop, share=first)
            for i, (tokens, done) in zip(live, out):
                parts[i].append(tokens)
                versions[i].append(torch.full((len(tokens),), version, dtype=torch.long))
                ended[i] = done
            if not stop.changed:                                # the call ran to its end with one version
                break
            budget -= max(len(tokens) for tokens, _ in out)     # the unfinished rows all sampled this many
            live, version, first = [i for i in live if not ended[i]], stop.now, False
        empty = torch.zeros(0, dtype=torch.long)
        return [(torch.cat(parts[i]) if parts[i] else empty, ended[i], torch.cat(versions[i]) if versions[i] else empty)
                for i in range(n)]

    def caches_turns(self) -> bool:
        """Whether `sample_turns` can keep trajectories' caches across turns: a verified model (vlm.prefix), no
        lockstep decoding across ranks, and no interruptible rollouts (new weights would void a cache)."""
        return not self.synced and self.check is None and reason_unshared(self.hf) is None

    @torch.no_grad()
    def sample_turns(self, rows: list, spec: SamplingSpec, row_seeds: list[int] | None, device,
                     states: list) -> tuple[list, list]:
        """Like `sample_rows` for the live trajectories of a group, each continuing its KV cache from the last turn
        (`states`, None for a fresh one; vlm.turn_cache): ([(completion tokens, ended_with_stop)], new states)."""
        from vlm.turn_cache import sample_turns

        was_training = self.hf.training
        self.hf.eval()
        try:
            gens = None if spec.greedy else [torch.Generator().manual_seed(s) for s in row_seeds]
            replies, states = sample_turns(self.hf, rows, states, self._kwargs(spec, gens)["logits_processor"],
                                           spec.max_new_tokens, self.stop_ids, self.pad_id, self.image_token_id,
                                           device)
            self.last_versions = None
            return [_trim(r, self.stop_ids) for r in replies], states
        finally:
            self.hf.train(was_training)

    @torch.no_grad()
    def sample_rows(self, rows: list, spec: SamplingSpec, row_seeds: list[int] | None, device) -> list:
        """One generate call over `rows` (PromptInputs, left-padded together), row r drawing from a generator
        seeded `row_seeds[r]` (None for greedy): [(completion tokens, ended_with_stop)] per row. The caller
        decides which rows share a call (multi-turn episodes: the live trajectories of one group). With a `check`
        installed (interruptible rollouts) the call takes newer weights at its start and at each token boundary,
        and `last_versions` holds each row's [t] version per token (else None)."""
        was_training = self.hf.training
        self.hf.eval()
        try:
            gens = None if spec.greedy else [torch.Generator().manual_seed(s) for s in row_seeds]
            if self.check is None or spec.greedy:
                self.last_versions = None
                return self._generate(rows, spec, gens, device)
            out = self._interruptible(rows, spec, gens, device)
            self.last_versions = [versions for _, _, versions in out]
            return [(tokens, ended) for tokens, ended, _ in out]
        finally:
            self.hf.train(was_training)

    @torch.no_grad()
    def sample(self, prompts: list, group_size: int, spec: SamplingSpec, seeds: list[int],
               device) -> tuple[list[torch.Tensor], list[bool]]:
        """`group_size` completions per prompt, prompt-major (row p * G + j is sample j of prompt p), and
        whether each ended with a stop token. Sampling seeds sample j of prompt p with
        sample_seed(seeds[p], j); greedy decoding (evaluation) needs no seeds and batches rows of all
        prompts, `rows_per_call` at a time (every process evaluates the same batches)."""
        was_training = self.hf.training
        self.hf.eval()
        results: dict[tuple[int, int], tuple] = {}
        interrupt = self.check is not None and not spec.greedy
        try:
            if spec.greedy:
                keys = [(p, j) for p in range(len(prompts)) for j in range(group_size)]
                per = self.rows_per_call or len(keys)
                calls = [keys[lo:lo + per] for lo in range(0, len(keys), per)]
            else:
                calls = generate_calls(len(prompts), group_size, self.rows_per_call)
            for call in calls:
                gens = None if spec.greedy else [torch.Generator().manual_seed(sample_seed(seeds[p], j))
                                                 for p, j in call]
                rows = [prompts[p] for p, _ in call]
                out = self._interruptible(rows, spec, gens, device) if interrupt else self._generate(rows, spec, gens,
                                                                                                      device)
                results.update(zip(call, out))
        finally:
            self.hf.train(was_training)
        ordered = [results[(p, j)] for p in range(len(prompts)) for j in range(group_size)]
        self.last_versions = [r[2] for r in ordered] if interrupt else None
        return [r[0] for r in ordered], [r[1] for r in ordered]
