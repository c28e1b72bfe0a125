"""The Policy protocol as the core drives it: the required members and the capabilities checked at build (a run
that needs one its policy lacks is a config error naming the key), the adapters implementing them without
inheriting from them, the KL reference as an explicit input of `log_probs`, and the one evaluation seed formula."""

import pytest
import torch

from mmrl.testing.bandit import BanditPolicy
from mmrl.data import eval_seed
from mmrl.config import ConfigError
from mmrl.types import (Evaluates, Exports, ForwardProcess, HasExtraState, HasReference, Policy, PolicyCannotEvaluate,
                        Reference, Shardable, check_capabilities, check_policy)

CAPABILITIES = (HasReference, Evaluates, Exports, ForwardProcess, Shardable, HasExtraState)


class Minimal:
    """The required members only."""

    model = torch.nn.Linear(1, 1)

    def rollout(self, prompts, group_size): ...

    def log_probs(self, rollout, index, reference=None): ...

    def trainable_parameters(self): ...

    def save(self, path): ...

    def load(self, path): ...


def test_a_minimal_policy_has_no_capability_and_each_needed_one_is_named():
    policy = Minimal()
    assert isinstance(policy, Policy) and not any(isinstance(policy, c) for c in CAPABILITIES)
    check_policy(policy, "mine")
    check_capabilities(policy, kl_beta=0.0, eval_every=0, objective="pg")          # needs none
    with pytest.raises(PolicyCannotEvaluate, match=r"'eval.every'.*set eval\.every=0"):
        check_capabilities(policy, kl_beta=0.0, eval_every=5, objective="pg")
    with pytest.raises(ConfigError, match=r"'algo.kl_beta'.*no reference model"):
        check_capabilities(policy, kl_beta=0.1, eval_every=0, objective="pg")
    with pytest.raises(ConfigError, match=r"'algo.objective'.*no forward-process loss"):
        check_capabilities(policy, kl_beta=0.0, eval_every=0, objective="nft")


def test_the_adapters_implement_their_capabilities_without_inheriting_any():
    from diffusion.policy import DiffusionPolicy
    from vlm.agent import AgentPolicy
    from vlm.policy import VLMPolicy

    def members(protocol):
        return [n for n in vars(protocol) if not n.startswith("_")]

    has = {cls: {c.__name__ for c in CAPABILITIES if all(hasattr(cls, m) for m in members(c))}
           for cls in (BanditPolicy, VLMPolicy, AgentPolicy, DiffusionPolicy)}
    assert has[BanditPolicy] == {"HasReference", "Evaluates"}
    assert has[VLMPolicy] == has[AgentPolicy] == {"HasReference", "Evaluates", "Exports", "Shardable"}
    assert has[DiffusionPolicy] == {"HasReference", "Evaluates", "Exports", "ForwardProcess", "Shardable",
                                    "HasExtraState"}
    for cls in has:                                                      # no implementation inherited from them
        assert not set(cls.__mro__) & {Policy, *CAPABILITIES}, cls
    # the single-turn and the agent policy share their parts, not a branch on episodes
    assert VLMPolicy.__mro__[1] is AgentPolicy.__mro__[1] and not hasattr(VLMPolicy, "_episodes")


def test_cli_exits_2_when_the_policy_cannot_evaluate(tmp_path, monkeypatch, capsys, bandit_config):
    from mmrl.cli import main

    import mmrl.testing.bandit

    monkeypatch.setattr(mmrl.testing.bandit, "build", lambda cfg, ctx: Minimal())     # a policy without generate_eval
    code = main(["train", bandit_config, f"output_dir={tmp_path}", "max_steps=1", "eval.every=1"])
    err = capsys.readouterr().err
    assert code == 2 and "eval.every=0" in err and "Traceback" not in err, err
    assert not (tmp_path / "metrics.jsonl").exists()                    # refused at build, before any step


def test_a_built_object_missing_a_protocol_member_is_named():
    class Partial:
        model = torch.nn.Linear(1, 1)

        def rollout(self, prompts, group_size):
            raise AssertionError

    with pytest.raises(ValueError, match="policy.name.*log_probs, trainable_parameters, save, load"):
        check_policy(Partial(), "mine")


def test_reference_select_slices_log_probs_and_state():
    ref = Reference(log_probs=torch.arange(6.0).view(3, 2), state={"mean": torch.arange(3.0), "tag": ["a", "b", "c"]})
    part = ref.select(torch.tensor([2, 0]))
    assert torch.equal(part.log_probs, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    assert torch.equal(part.state["mean"], torch.tensor([2.0, 0.0])) and part.state["tag"] == ["c", "a"]
    assert len(part) == 2 and len(Reference(state={"mean": torch.zeros(4, 1)})) == 4


def test_update_hands_each_microbatch_its_slice_of_the_reference(tmp_path, monkeypatch, run_bandit):
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


def test_evaluation_seeds_come_from_eval_seed(tmp_path, monkeypatch, run_bandit):
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
