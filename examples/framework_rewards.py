"""The bandit's `match` reward (the fraction of positions whose arm is the target arm) written once
for each framework whose reward functions mmrl calls unchanged (docs/guides/rewards.md, "Reward functions
from other frameworks"); tests/rewards/test_styles.py trains with all of them side by side."""


def _match(output: str, answer: str) -> float:
    got, want = str(output).split(), str(answer).split()
    return sum(a == b for a, b in zip(got, want)) / max(len(want), 1)


def trl_match(completions, answer, **kwargs):
    """TRL: conversational completions, dataset columns as keyword lists."""
    return [_match(c[0]["content"], a) for c, a in zip(completions, answer)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """veRL: one sample, a float or {"score": ...}."""
    return {"score": _match(solution_str, ground_truth), "data_source": data_source}


def easyr1_match(reward_inputs, format_weight: float = 0.0):
    """EasyR1 (batch): a dict per input, "overall" is the reward."""
    return [{"overall": (1 - format_weight) * _match(x["response"], x["ground_truth"]), "format": 1.0}
            for x in reward_inputs]
