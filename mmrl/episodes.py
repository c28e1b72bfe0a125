"""Episodes of an environment as the core sees them (the `env:` section; multi-turn agents).

With an `env:` section a step's "prompts" are environment seeds: record i of the training set is
`{"env_seed": i}` for i < env.train_seeds, held-out record k is `{"env_seed": env.eval_seed_start + k}`,
so held-out episodes never reuse a training seed. The usual `PromptSampler` shuffles and resumes
them (the seeds are in every checkpoint); the G samples of a group are G trajectories from the same
seed. An adapter that runs episodes (`validate_episodes` in its module) returns one reward `Sample`
per trajectory whose `meta` holds the keys of `EpisodeMeta`; the core reads them only for metrics.
"""

from __future__ import annotations

import torch

from mmrl.distributed.reduce import Metric, mean, weighted_mean

SEED_KEY = "env_seed"


class EpisodeMeta:
    """Keys of a trajectory sample's `meta` (written by the adapter, read by metrics and rewards)."""

    RETURN = "return"                    # float: sum of the per-turn rewards (invalid actions at env.invalid_action_reward)
    TURN_REWARDS = "turn_rewards"        # list[float], one per model reply
    TURN_TOKENS = "turn_tokens"          # list[int]: action tokens of each reply (its columns of the sample's [T] row, in order)
    STATES = "turn_states"               # list[str]: a key of the observation each reply answered (equal keys = same state)
    ACTIONS = "actions"                  # list[str | None]: the parsed action text of each reply (None: did not parse)
    REPLIES = "replies"                  # list[str]: the model's replies
    TURNS = "turns"                      # int: model replies in the episode
    SUCCESS = "success"                  # bool: the environment's info["success"] at the end
    INVALID = "invalid_actions"          # int: replies whose action did not parse
    TERMINATED = "terminated"            # bool: the environment ended the episode
    TRUNCATED = "truncated"              # bool: env truncation, env.max_turns, or a context over policy.max_prompt_tokens
    SEED = SEED_KEY                      # int: the environment seed
    FINAL_IMAGE = "final_image"          # PIL image or None: the observation after the last reply (not shown to the model)
    TOOL_CALLS = "tool_calls"            # list[list[dict]] per reply: its tool calls {name, arguments, error, result, images}
    TOOLS = "tools"                      # list[str]: the run's tool names (the same in every sample)
    ROLE = "role"                        # str: the role the trajectory played (multi-role environments, mmrl.roles)


def train_records(env) -> list[dict]:
    """The training 'dataset': one record per training seed."""
    return [{SEED_KEY: i} for i in range(env.train_seeds)]


def eval_records(env, n: int) -> list[dict]:
    """The first `n` held-out seeds."""
    return [{SEED_KEY: env.eval_seed_start + k} for k in range(n)]


def distinct_ngrams(texts: list[str], n: int = 2) -> float:
    """Distinct word n-grams / all n-grams over `texts` (1.0 = no repetition; Li et al. 2016, arXiv 1510.03055).
    A reply shorter than n counts as one n-gram of itself; 1.0 when there are none."""
    grams = []
    for text in texts:
        words = text.split()
        grams += [tuple(words[i:i + n]) for i in range(len(words) - n + 1)] or [tuple(words)]
    return len(set(grams)) / len(grams) if grams else 1.0


def episode_metrics(samples: list, total: torch.Tensor, group_size: int) -> dict[str, Metric]:
    """Echo-trap diagnostics of one round of trajectories (RAGEN, arXiv 2504.20073): turns, success,
    invalid-action fraction, the within-group spread of the reward and the diversity of the replies.
    total: [N] combined reward per trajectory (NaN = unscorable)."""
    metas = [s.meta for s in samples]
    turns = sum(m[EpisodeMeta.TURNS] for m in metas)
    n = len(metas)
    groups = total.view(-1, group_size)                                          # [P, G]
    spread = torch.stack([g[~torch.isnan(g)].std(unbiased=False) if (~torch.isnan(g)).sum() > 1
                          else g.new_zeros(()) for g in groups]) if n else total.new_zeros(0)  # [P]
    replies = [[" ".join(m[EpisodeMeta.REPLIES]) for m in metas[p:p + group_size]] for p in range(0, n, group_size)]
    return {
        "env/turns/mean": weighted_mean(turns / max(n, 1), n),
        "env/success": weighted_mean(sum(bool(m[EpisodeMeta.SUCCESS]) for m in metas) / max(n, 1), n),
        "env/invalid_action_frac": weighted_mean(sum(m[EpisodeMeta.INVALID] for m in metas) / max(turns, 1), turns),
        "env/truncated_frac": weighted_mean(sum(bool(m[EpisodeMeta.TRUNCATED]) for m in metas) / max(n, 1), n),
        "env/reward_group_std": mean(float(spread.mean()) if spread.numel() else 0.0),
        "env/distinct_2": mean(sum(distinct_ngrams(r) for r in replies) / max(len(replies), 1)),
        **tool_metrics(samples),
    }


def tool_metrics(samples: list) -> dict[str, Metric]:
    """Tool use of one round of trajectories (empty when the run has no tools): calls per episode, the share of
    episodes that call a tool before their first environment action, calls per tool and errors per episode
    (all and by kind, `tools.ERROR_KINDS`). The keys depend on the run's tools only, so every process logs the same."""
    from tools import ERROR_KINDS

    metas = [s.meta for s in samples if isinstance(s.meta, dict)]
    names = sorted({n for m in metas for n in m.get(EpisodeMeta.TOOLS, [])})
    if not names:
        return {}
    n = len(metas)
    calls = [c for m in metas for reply in m.get(EpisodeMeta.TOOL_CALLS, []) for c in reply]

    def first_calls(m) -> bool:
        replies = m.get(EpisodeMeta.TOOL_CALLS, [])
        return bool(replies) and bool(replies[0])

    out = {"tools/calls_per_episode": weighted_mean(len(calls) / max(n, 1), n),
           "tools/episodes_calling_first": weighted_mean(sum(first_calls(m) for m in metas) / max(n, 1), n),
           "tools/errors": weighted_mean(sum(c["error"] is not None for c in calls) / max(n, 1), n)}
    for kind in ERROR_KINDS:
        out[f"tools/errors/{kind}"] = weighted_mean(sum(c["error"] == kind for c in calls) / max(n, 1), n)
    for name in names:
        out[f"tools/{name}/calls"] = weighted_mean(sum(c["name"] == name for c in calls) / max(n, 1), n)
    return out


def eval_success(samples: list) -> float | None:
    """Fraction of held-out episodes solved; None when the samples are not episodes."""
    flags = [s.meta.get(EpisodeMeta.SUCCESS) for s in samples if isinstance(s.meta, dict)]
    if not flags or any(f is None for f in flags):
        return None
    return sum(bool(f) for f in flags) / len(flags)
