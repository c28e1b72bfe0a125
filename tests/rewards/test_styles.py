"""Reward functions written for TRL, veRL and EasyR1, called as those frameworks call them (`style:`)."""

import json
import math
import subprocess

import pytest

from rewards.registry import LookupFailed, check, resolve
from rewards.sample import Sample
from rewards.scorer import RewardSet, parse_specs
from rewards.styles import STYLES, adapt, detect
from tests import BANDIT, REPO

EXAMPLES = f"{REPO}/examples/framework_rewards.py"


def _samples():
    return [Sample(prompt="p0", output="1 2", answer="1 3", images=["img0"],
                   meta={"num_tokens": 2, "completion_ids": [5, 6], "solution": "s0", "data_source": "d0"}, id="a"),
            Sample(prompt="p1", output="4", answer="4", images=["img1"],
                   meta={"num_tokens": 1, "completion_ids": [7], "solution": "s1",
                         "reward_model": {"ground_truth": "rm1"}, "extra_info": {"k": 1}}, id="b")]


def test_auto_detection_reads_the_signature_where_it_is_unambiguous():
    def native(samples, scale=1.0): ...
    def trl(prompts, completions, **kwargs): ...
    def trl_ids(completion_ids, **kwargs): ...
    def verl(data_source, solution_str, ground_truth, extra_info=None): ...
    def easy(reward_inputs, format_weight=0.1): ...
    def easy_seq(reward_input): ...
    def other(batch): ...
    got = [detect(f) for f in (native, trl, trl_ids, verl, easy, easy_seq, other)]
    assert got == ["mmrl", "trl", "trl", "verl", "easyr1", "easyr1_sequential", "mmrl"]


def test_trl_style_gets_conversational_prompts_completions_ids_and_columns():
    seen = {}

    def reward(prompts, completions, completion_ids, **columns):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, columns=columns)
        return [0.5, None]

    assert adapt(reward, "trl")(_samples()) == [0.5, None]
    assert seen["prompts"] == [[{"role": "user", "content": "p0"}], [{"role": "user", "content": "p1"}]]
    assert seen["completions"] == [[{"role": "assistant", "content": "1 2"}], [{"role": "assistant", "content": "4"}]]
    assert seen["ids"] == [[5, 6], [7]]
    cols = seen["columns"]
    assert cols["answer"] == ["1 3", "4"] and cols["images"] == [["img0"], ["img1"]]
    assert cols["solution"] == ["s0", "s1"] and cols["data_source"] == ["d0", None]
    assert cols["num_tokens"] == [2, 1] and "completion_ids" not in cols


def test_verl_style_is_called_per_sample_with_its_ground_truth_and_extra_info():
    calls = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return {"score": 0.25, "acc": 1} if solution_str == "4" else 0.75

    assert adapt(compute_score, "auto")(_samples()) == [0.75, 0.25]
    assert calls == [("d0", "1 2", "1 3", {}), ("", "4", "rm1", {"k": 1})]


def test_easyr1_styles_read_overall():
    inputs = []

    def batch(reward_inputs):
        inputs.extend(reward_inputs)
        return [{"overall": float(i), "format": 1.0} for i, _ in enumerate(reward_inputs)]

    def sequential(reward_input):
        return {"overall": reward_input["response_length"] / 10}

    assert adapt(batch, "auto")(_samples()) == [0.0, 1.0]
    assert inputs == [{"response": "1 2", "response_length": 2, "ground_truth": "1 3"},
                      {"response": "4", "response_length": 1, "ground_truth": "4"}]
    assert adapt(sequential, "auto")(_samples()) == [0.2, 0.1]


def test_a_dict_score_without_its_key_makes_the_sample_unscorable(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                   "    return {'acc': 1.0} if solution_str == '4' else {'score': 0.5}\n")
    rs = RewardSet(parse_specs([{"name": f"{bad}:compute_score", "max_fail_frac": 1.0}]))
    scores, metrics = rs.score(_samples())
    assert scores[0, 0].item() == 0.5 and math.isnan(scores[1, 0].item())
    assert metrics["reward/compute_score/failed"] == 1


def test_config_errors_name_the_entry():
    with pytest.raises(ValueError, match=r"rewards\[0\].style.*'tlr' is not one of " + ", ".join(STYLES)):
        parse_specs([{"name": "format", "style": "tlr"}])
    with pytest.raises(LookupFailed, match=r"'ground_truth' is filled by the verl caller"):
        check(f"{EXAMPLES}:compute_score", {"ground_truth": "x"}, "rewards[0].name")
    with pytest.raises(LookupFailed, match=r"takes no argument 'weight_x'; its arguments: format_weight"):
        check(f"{EXAMPLES}:easyr1_match", {"weight_x": 1}, "rewards[0].name")
    assert resolve(f"{EXAMPLES}:easyr1_match", {"format_weight": 0.5})(_samples()) == [0.25, 0.5]


def test_trl_reward_functions_give_the_scores_trl_gives_them():
    """TRL's own `accuracy_reward` and `think_format_reward`, through `style: trl`, against calling
    them with the inputs TRL's GRPOTrainer builds for a conversational dataset."""
    rewards = pytest.importorskip("trl.rewards")
    outputs = [r"<think>x</think>The answer is $\frac{1}{2}$", "<think>y</think>$3$", "no think $\\frac{1}{3}$"]
    solutions = [r"$\frac{1}{2}$", "$4$", r"$\frac{1}{3}$"]
    samples = [Sample(prompt="q", output=o, meta={"solution": s}, id=str(i))
               for i, (o, s) in enumerate(zip(outputs, solutions))]
    completions = [[{"role": "assistant", "content": o}] for o in outputs]
    for name, direct in (("accuracy_reward", rewards.accuracy_reward(completions, solution=solutions)),
                         ("think_format_reward", rewards.think_format_reward(completions))):
        for style in ("trl", "auto"):
            rs = RewardSet(parse_specs([{"name": f"trl.rewards:{name}", "style": style}]))
            scores, _ = rs.score(samples)
            assert scores[:, 0].tolist() == direct, (name, style)
        assert sorted(set(direct)) == [0.0, 1.0], (name, direct)             # the samples tell them apart


@pytest.mark.integration
def test_training_with_each_framework_style_scores_like_the_native_reward(tmp_path, mmrl_cmd):
    """The bandit trains on its native `match`; the same reward written for TRL, veRL and EasyR1 is
    scored alongside (weight 0) and gives the same reward/<label>/mean at every step."""
    entries = ", ".join([
        "{name: 'mmrl.testing.bandit:match', label: match}",
        f"{{name: '{EXAMPLES}:trl_match', style: trl, weight: 0, label: trl}}",
        f"{{name: '{EXAMPLES}:compute_score', weight: 0, label: verl}}",
        f"{{name: '{EXAMPLES}:easyr1_match', style: easyr1, weight: 0, label: easyr1, format_weight: 0.0}}"])
    out = subprocess.run(mmrl_cmd("train", BANDIT, f"output_dir={tmp_path}", "max_steps=4", "eval.every=0",
                                  f"rewards=[{entries}]"), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl") if '"reward/match/mean"' in line]
    assert len(rows) == 4
    for r in rows:
        assert r["reward/trl/mean"] == r["reward/verl/mean"] == r["reward/easyr1/mean"] == r["reward/match/mean"], r
    assert len({r["reward/match/mean"] for r in rows}) > 1                    # the policy moved
