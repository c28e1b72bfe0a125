"""Per-prompt randomness of the diffusion adapter: a prompt's images (rollout and evaluation) depend on
its own seed only, not on the prompts beside it; and the KL reference exists only when it is used."""

import numpy as np
import pytest
import torch

from mmrl.types import select

TEXTS = ["a red circle", "a blue square", "a green triangle"]


def _pixels(samples) -> list:
    return [np.asarray(s.output) for s in samples]


@pytest.mark.parametrize("kind,overrides", [("sd3", ("timesteps.select=fraction",)),
                                            ("sd", ("shared_noise=true", "forward_batch=3"))])
def test_a_prompt_samples_the_same_alone_or_beside_others(kind, overrides, build_tiny, prompts):
    policy = build_tiny(kind, *overrides)
    many = policy.rollout(prompts(TEXTS, seeds=[7, 8, 9], step=2), group_size=2)
    alone = policy.rollout(prompts(TEXTS[1:2], seeds=[8], step=2), group_size=2)
    mine = select(many, torch.tensor([2, 3]))
    assert len(mine.samples) == len(alone.samples) == 2
    assert all(np.array_equal(x, y) for x, y in zip(_pixels(mine.samples), _pixels(alone.samples), strict=True))
    assert torch.equal(mine.log_probs, alone.log_probs)
    assert torch.equal(mine.state["step_index"], alone.state["step_index"])     # fraction: the prompt's own subset
    assert not np.array_equal(_pixels(many.samples)[0], _pixels(many.samples)[2])


def test_evaluation_images_depend_on_the_prompt_seed_only(build_tiny, prompts):
    policy = build_tiny("sd3")
    many = policy.generate_eval(prompts(TEXTS, seeds=[3, 4, 5], step=-1))
    alone = policy.generate_eval(prompts(TEXTS[2:], seeds=[5], step=-1))
    assert np.array_equal(_pixels(many)[2], _pixels(alone)[0])
    moved = policy.generate_eval(prompts(TEXTS[2:], seeds=[6], step=-1))
    assert not np.array_equal(_pixels(moved)[0], _pixels(alone)[0])


@pytest.mark.parametrize("kl_beta,built", [(0.0, False), (0.1, True)])
def test_full_finetuning_copies_a_reference_only_for_a_kl(kl_beta, built, build_tiny):
    policy = build_tiny("sd3", "lora.rank=0", "reference=true", kl_beta=kl_beta)
    assert (policy.reference_model is not None) == built
