"""The Policy protocol as the core drives it: `generate_eval` with its documented default, the KL
reference as an explicit input of `log_probs`, and the one evaluation seed formula."""

import pytest
import torch

from helpers import run_bandit
from mmrl.bandit import BanditPolicy
from mmrl.data import eval_seed
from mmrl.types import Policy, PolicyCannotEvaluate, PromptBatch, Reference, check_policy


class NoEval(Policy):
    """A policy that implements everything but evaluation (so it inherits the default)."""


def test_default_generate_eval_is_a_config_error_naming_eval_every():
    batch = PromptBatch(rows=[{}], index=[0], seeds=[0], step=-1)
    with pytest.raises(PolicyCannotEvaluate, match=r"eval\.every=0"):
        NoEval().generate_eval(batch)


def test_cli_exits_2_when_the_policy_cannot_evaluate(tmp_path, monkeypatch, capsys, bandit_config):
    from mmrl.cli import main

    monkeypatch.setattr(BanditPolicy, "generate_eval", Policy.generate_eval)
    code = main(["train", bandit_config, f"output_dir={tmp_path}", "max_steps=1", "eval.every=1"])
    err = capsys.readouterr().err
    assert code == 2 and "eval.every=0" in err and "Traceback" not in err, err


def test_a_built_object_missing_a_protocol_member_is_named():
    class Partial:
        model = torch.nn.Linear(1, 1)

        def rollout(self, prompts, group_size):
            raise AssertionError

    with pytest.raises(ValueError, match="policy.name.*log_probs.*generate_eval"):
        check_policy(Partial(), "mine")


def test_reference_select_slices_log_probs_and_state():
    ref = Reference(log_probs=torch.arange(6.0).view(3, 2), state={"mean": torch.arange(3.0), "tag": ["a", "b", "c"]})
    part = ref.select(torch.tensor([2, 0]))
    assert torch.equal(part.log_probs, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    assert torch.equal(part.state["mean"], torch.tensor([2.0, 0.0])) and part.state["tag"] == ["c", "a"]
    assert len(part) == 2 and len(Reference(state={"mean": torch.zeros(4, 1)})) == 4


def test_update_hands_each_microbatch_its_slice_of_the_reference(tmp_path, monkeypatch):
    seen, scored = [], BanditPolicy.log_probs

    def recording(self, rollout, index, reference=None):
        full = self.reference_log_probs(rollout, index) if reference is not None else None
        seen.append(None if reference is None else torch.equal(reference.log_probs, full.log_probs))
        return scored(self, rollout, index, reference)

    monkeypatch.setattr(BanditPolicy, "log_probs", recording)
    tied = run_bandit(tmp_path / "tied", "max_steps=1", "eval.every=0", "algo.kl_beta=0.5")
    assert seen and all(seen)
    seen.clear()
    free = run_bandit(tmp_path / "free", "max_steps=1", "eval.every=0")
    assert seen and all(s is None for s in seen)
    assert tied.policy.ref is not None and free.policy.ref is None       # kl_beta 0: no reference kept


def test_evaluation_seeds_come_from_eval_seed(tmp_path, monkeypatch):
    seeds, evaluate = [], BanditPolicy.generate_eval

    def recording(self, prompts):
        seeds.extend(zip(prompts.index, prompts.seeds))
        return evaluate(self, prompts)

    monkeypatch.setattr(BanditPolicy, "generate_eval", recording)
    run_bandit(tmp_path, "seed=5", "max_steps=1", "eval.every=1", "eval.prompts_per_batch=3")
    once = [(i, eval_seed(5, i)) for i in range(4)]
    assert seeds == once + once                                          # step 0 and step 1: the same seeds
    assert len({s for _, s in once}) == 4


def test_a_kl_without_a_reference_is_a_config_error(tmp_path, capsys, bandit_config):
    from mmrl.cli import main

    code = main(["train", bandit_config, f"output_dir={tmp_path}", "max_steps=1", "algo.kl_beta=0.5",
                 "policy.reference=false"])
    err = capsys.readouterr().err
    assert code == 2 and "policy.reference" in err and "Traceback" not in err, err
