"""Reward functions written for other frameworks, called the way those frameworks call them.

A reward entry's `style:` says how its function is called (default `auto`: read from the signature):

    mmrl               fn(samples, **kwargs) -> list[float | None]  (rewards.Sample; the native protocol)
    trl                fn(prompts=..., completions=..., completion_ids=..., **columns, **kwargs) -> list,
                       as TRL's GRPOTrainer calls a reward function: conversational prompts
                       [{"role": "user", "content": prompt}] and completions [{"role": "assistant",
                       "content": output}], the token ids of each completion (the VLM adapter records
                       them; None where an adapter does not), and every dataset column as a list with one
                       entry per completion (`answer`, `images` and the record's other columns, plus what
                       the adapter records in `Sample.meta`); TRL's trainer_state, log_extra and
                       log_metric are not passed (they have no counterpart here)
    verl               compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...,
                       **kwargs) per sample, as veRL's reward manager calls it; a float, or a dict whose
                       "score" is the reward. data_source and extra_info come from the record's columns of
                       those names ("" and {} without them); ground_truth from its
                       reward_model.ground_truth when it has one (veRL's data layout), else `answer`
    easyr1             compute_score(reward_inputs, **kwargs) on the batch, as EasyR1's batch reward
                       manager calls it: dicts {"response", "response_length", "ground_truth"}; each
                       returned dict's "overall" is the reward
    easyr1_sequential  compute_score(reward_input, **kwargs) per sample (EasyR1's sequential manager)

`auto` picks a style only where the signature is unambiguous: a first parameter named `samples` is
mmrl; `data_source`, `solution_str` and `ground_truth` together are verl; a parameter named
`completions` or `completion_ids` is trl; a first parameter named `reward_inputs` / `reward_input` is
easyr1 / easyr1_sequential; anything else is mmrl.
"""

from __future__ import annotations

import inspect
from typing import Callable

STYLES = ("auto", "mmrl", "trl", "verl", "easyr1", "easyr1_sequential")
TRL_OWN = ("prompts", "completions", "completion_ids")      # what TRL passes besides the columns
VERL_OWN = ("data_source", "solution_str", "ground_truth", "extra_info")


def check_style(style: str, where: str) -> str:
    if style not in STYLES:
        raise ValueError(f"{where}: style {style!r} is not one of {', '.join(STYLES)}")
    return style


def _names(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def detect(fn: Callable) -> str:
    """The style of `fn` read from its signature (see the module docstring); mmrl when unsure."""
    names = _names(fn)
    first = names[0] if names else ""
    if first == "samples":
        return "mmrl"
    if {"data_source", "solution_str", "ground_truth"} <= set(names):
        return "verl"
    if "completions" in names or "completion_ids" in names:
        return "trl"
    if first in ("reward_inputs", "reward_input"):
        return "easyr1" if first == "reward_inputs" else "easyr1_sequential"
    return "mmrl"


def own_arguments(style: str) -> tuple[str, ...]:
    """The arguments a style's caller fills (config keyword arguments must not name them)."""
    return {"trl": TRL_OWN, "verl": VERL_OWN, "easyr1": ("reward_inputs",),
            "easyr1_sequential": ("reward_input",)}.get(style, ())


def adapt(fn: Callable, style: str) -> Callable:
    """`fn` (its config keyword arguments already bound) as a native reward `samples -> list`."""
    if style == "auto":
        style = detect(fn)
    return {"mmrl": lambda f: f, "trl": _trl, "verl": _verl, "easyr1": _easyr1,
            "easyr1_sequential": _easyr1_sequential}[style](fn)


def _columns(samples: list) -> dict[str, list]:
    """The dataset columns, one entry per sample, as TRL passes them (its own arguments left out)."""
    cols: dict[str, list] = {}
    if any(s.answer is not None for s in samples):
        cols["answer"] = [s.answer for s in samples]
    if any(s.images for s in samples):
        cols["images"] = [list(s.images) for s in samples]
    keys = [k for s in samples for k in s.meta]
    for k in dict.fromkeys(keys):                                             # first-seen order
        if k not in TRL_OWN and k not in cols:
            cols[k] = [s.meta.get(k) for s in samples]
    return cols


def _trl(fn: Callable) -> Callable:
    def call(samples: list) -> list:
        prompts = [[{"role": "user", "content": s.prompt}] for s in samples]
        completions = [[{"role": "assistant", "content": s.output}] for s in samples]
        ids = [s.meta.get("completion_ids") for s in samples]
        return list(fn(prompts=prompts, completions=completions, completion_ids=ids, **_columns(samples)))
    return call


def _pick(score, key: str, style: str):
    """A float, or the `key` entry of a dict score."""
    if isinstance(score, dict):
        if key not in score:
            raise ValueError(f"a {style}-style reward returned a dict without {key!r} (keys: {sorted(score)})")
        return score[key]
    return score


def _verl(fn: Callable) -> Callable:
    def call(samples: list) -> list:
        out = []
        for s in samples:
            rm = s.meta.get("reward_model")
            truth = rm["ground_truth"] if isinstance(rm, dict) and "ground_truth" in rm else s.answer
            score = fn(data_source=s.meta.get("data_source", ""), solution_str=s.output, ground_truth=truth,
                       extra_info=dict(s.meta.get("extra_info") or {}))
            out.append(_pick(score, "score", "verl"))
        return out
    return call


def _easyr1_input(s) -> dict:
    """EasyR1's RewardInput; response_length is the completion's token count where the adapter records it."""
    return {"response": s.output, "response_length": s.meta.get("num_tokens"), "ground_truth": s.answer}


def _easyr1(fn: Callable) -> Callable:
    def call(samples: list) -> list:
        scores = fn([_easyr1_input(s) for s in samples])
        if not isinstance(scores, (list, tuple)):
            raise ValueError(f"an easyr1-style reward must return a list of dicts, got {type(scores).__name__}")
        return [_pick(sc, "overall", "easyr1") for sc in scores]
    return call


def _easyr1_sequential(fn: Callable) -> Callable:
    def call(samples: list) -> list:
        return [_pick(fn(_easyr1_input(s)), "overall", "easyr1") for s in samples]
    return call
