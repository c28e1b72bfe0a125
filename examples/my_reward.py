"""A reward in a plain Python file. Name it in a config as
`rewards: [{name: examples/my_reward.py:small_numbers, scale: 8}]`."""

import re


def small_numbers(samples, scale: float = 10.0):
    """1.0 when every number in the output is 0, falling linearly to 0.0 at `scale`."""
    scores = []
    for s in samples:
        numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", str(s.output))]
        if not numbers:
            scores.append(None)          # unscorable: excluded from its group, advantage 0
            continue
        mean = sum(numbers) / len(numbers)
        scores.append(max(0.0, 1.0 - mean / scale))
    return scores
