"""A reward for the multi-role tests, loaded by path (`tests/vlm/team_reward.py:distinct_letters`): the number of
distinct letters of a trajectory's replies over 10, so untrained tiny models' samples differ in reward and the
updates of both policies have a signal."""


def distinct_letters(samples: list) -> list:
    return [len({c for c in s.output if c.isalpha()}) / 10 for s in samples]
