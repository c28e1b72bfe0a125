"""Edges of the VLM adapter's scoring that the other tests leave open, each checked against a value
computed here independently of the code under test:

- token log-probs and entropies at temperature != 1 and with final-logit soft-capping (vlm/logprobs.py),
  against log_softmax(cap * tanh(logits / cap) / temperature) of the model's own raw logits;
- the image-token check in both directions (too few and too many placeholders, vlm/prompts.py and
  vlm/batch.py);
- `policy.truncation=left` drops the earliest text tokens only (vlm/prompts.py);
- `algo.max_len_norm` from a loaded config reaches the loss of the training update (mmrl/loop/update.py).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.types import PromptBatch
from tests import REPO

VLM_TINY = os.path.join(REPO, "configs", "tiny", "vlm_tiny.yaml")
LOGIT_SCALE = 12.0     # the tiny model's raw logits have std ~0.2; scaled, temperature and capping matter
CAP = 4.0              # soft cap of the order of the scaled logits, so tanh is far from linear


def _batch(rows, index=None):
    index = list(range(len(rows))) if index is None else index
    return PromptBatch(rows=rows, index=index, seeds=[7 + i for i in range(len(rows))], step=0)


def _reference(raw: torch.Tensor, blocked: list, temperature: float, cap: float | None, *, cap_first=True):
    """log_softmax(cap * tanh(raw / cap) / temperature) over the tokens generation may emit (blocked ones
    get probability 0), in float64. raw: [..., V] logits of the model. cap_first=False applies the
    temperature before the cap (a wrong order, used only to show the test tells the two apart)."""
    z = raw.double()
    if not cap_first:
        z = z / temperature
    if cap:
        z = cap * torch.tanh(z / cap)
    if cap_first:
        z = z / temperature
    z[..., blocked] = float("-inf")
    return torch.log_softmax(z, -1)                                                     # [..., V]


def _entropy(logp_all: torch.Tensor) -> torch.Tensor:
    p = logp_all.exp()
    return -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)


def _raw_logits(hf, items, comps, tokens):
    """The model's own logits [n, T, V] at the positions that predict each completion token (the plain
    transformers forward, not the scorer), and the layout used."""
    from vlm.batch import collate, layout_for

    layout = layout_for(items, comps)
    batch = collate(items, comps, layout, tokens.pad_id, tokens.image_token_id, "cpu")
    with torch.no_grad():
        logits = hf(**batch, use_cache=False).logits.float()                             # [n, W, V]
    p, t = layout.prompt_width, layout.width - layout.prompt_width
    return logits[:, p - 1:p - 1 + t], layout


def _build(tmp, **overrides):
    from mmrl.config.policies import BuildContext
    from vlm.policy import Config, LoraSection, build

    fields = dict(model="tiny:qwen2_5_vl", min_pixels=784, max_pixels=3136, max_prompt_tokens=512,
                  max_new_tokens=6, logprob_chunk=4, lora=LoraSection(rank=0), old_log_probs="rollout")
    fields.update(overrides)
    torch.manual_seed(0)
    return build(Config(**fields), BuildContext(device=torch.device("cpu"), seed=0, output_dir=str(tmp), precision="fp32"))


@pytest.fixture(scope="module")
def scoring_case(tiny_cache, tmp_path_factory):
    """A tiny Qwen2.5-VL with sharper logits, two image prompts, two completions of different lengths
    (7 tokens: two chunks of 4; 3 tokens ending in EOS: a padded row) and the model's raw logits for them."""
    from shapes_world.standins import counting

    policy = _build(tmp_path_factory.mktemp("scoring"))
    hf, tk = policy.p.model.hf, policy.p.tokens
    with torch.no_grad():
        hf.get_output_embeddings().weight.mul_(LOGIT_SCALE)
    items = policy._prompts(_batch(counting(n=2, seed=0)))
    allowed = torch.tensor([i for i in range(hf.config.get_text_config().vocab_size) if i not in tk.blocked])
    gen = torch.Generator().manual_seed(0)
    pick = lambda k: allowed[torch.randint(len(allowed), (k,), generator=gen)]       # noqa: E731
    comps = [pick(7), torch.cat([pick(2), torch.tensor(tk.stop_ids[:1])])]
    raw, layout = _raw_logits(hf, items, comps, tk)
    return policy, items, comps, raw, layout


@pytest.mark.parametrize("temperature, cap", [(0.7, None), (1.3, None), (1.0, CAP), (0.7, CAP), (1.3, CAP)])
def test_log_probs_and_entropy_follow_temperature_and_softcap(scoring_case, monkeypatch, temperature, cap):
    """The scorer's log-probs and entropies equal log_softmax(cap*tanh(logits/cap)/temperature) of the
    model's raw logits (cap read from the text config's final_logit_softcapping, applied before the
    temperature, as vlm/logprobs.py documents), with and without grad (checkpointed chunks). The values
    are far (> 0.05) from what a dropped or doubled temperature, a dropped cap or a cap applied after the
    temperature would give, so each of those mistakes fails here."""
    from vlm.logprobs import TokenScorer

    policy, items, comps, raw, layout = scoring_case
    hf, tk = policy.p.model.hf, policy.p.tokens
    monkeypatch.setattr(hf.config.get_text_config(), "final_logit_softcapping", cap, raising=False)
    scorer = TokenScorer(hf, tk.blocked, temperature, 4, tk.pad_id, tk.image_token_id, False)
    t = layout.width - layout.prompt_width
    with torch.no_grad():
        logp, ent = scorer(items, comps, [layout] * 2, t)                                # [2, T]
    logp_grad, ent_grad = scorer(items, comps, [layout] * 2, t)
    ref_all = _reference(raw, tk.blocked, temperature, cap)                               # [2, T, V]
    wrong = {"temperature ignored": _reference(raw, tk.blocked, 1.0, cap),
             "temperature twice": _reference(raw, tk.blocked, temperature ** 2, cap),
             "cap ignored": _reference(raw, tk.blocked, temperature, None),
             "cap after temperature": _reference(raw, tk.blocked, temperature, cap, cap_first=False)}
    checked = 0
    for r, c in enumerate(comps):
        n = c.numel()
        ref = ref_all[r, :n].gather(-1, c[:, None]).squeeze(-1)                           # [n]
        torch.testing.assert_close(logp[r, :n].double(), ref, atol=2e-5, rtol=0)
        torch.testing.assert_close(ent[r, :n].double(), _entropy(ref_all[r, :n]), atol=2e-5, rtol=0)
        torch.testing.assert_close(logp_grad[r].detach(), logp[r], atol=1e-6, rtol=0)
        torch.testing.assert_close(ent_grad[r].detach(), ent[r], atol=1e-6, rtol=0)
        assert logp[r, n:].abs().sum() == 0 and ent[r, n:].abs().sum() == 0
        for name, other in wrong.items():
            if torch.equal(other, ref_all):       # the same distribution for this setting (e.g. T=1)
                continue
            bad = other[r, :n].gather(-1, c[:, None]).squeeze(-1)
            assert (bad - ref).abs().max() > 0.05, f"{name} would be indistinguishable at row {r}"
            checked += 1
    per_row = 2 * (temperature != 1) + (cap is not None) + (cap is not None and temperature != 1)
    assert checked == 2 * per_row                 # every mistake that changes the distribution was compared
    assert logp[1, 2].item() != 0.0               # the EOS target is scored, not masked


def test_policy_temperature_reaches_rollout_log_probs(make_policy, counting_rows):
    """policy.temperature from the config reaches the recorded old log-probs: a rollout at 1.3 records
    log_softmax(logits / 1.3) of the model's raw logits at every sampled token (not the T=1 values)."""
    policy = make_policy("qwen2_5_vl", lora_rank=0, temperature=1.3)
    hf, tk = policy.p.model.hf, policy.p.tokens
    with torch.no_grad():
        hf.get_output_embeddings().weight.mul_(LOGIT_SCALE)
    ro = policy.rollout(_batch(counting_rows[:2]), group_size=2)
    comps = ro.state["completion"]
    raw, _ = _raw_logits(hf, ro.state["prompt"], comps, tk)
    ref_all, plain_all = _reference(raw, tk.blocked, 1.3, None), _reference(raw, tk.blocked, 1.0, None)
    for r, c in enumerate(comps):
        n = c.numel()
        ref = ref_all[r, :n].gather(-1, c[:, None]).squeeze(-1)
        torch.testing.assert_close(ro.log_probs[r, :n].double(), ref, atol=2e-5, rtol=0)
        plain = plain_all[r, :n].gather(-1, c[:, None]).squeeze(-1)
        assert (plain - ref).abs().max() > 0.05


# ---------------------------------------------------------------- image placeholders vs features


def _one_item(policy, counting_rows, index=3):
    item = policy._prompts(_batch(counting_rows[:1], index=[index]))[0]
    image_id = policy.p.tokens.image_token_id
    positions = (item.input_ids == image_id).nonzero().squeeze(1)
    assert positions.numel() == item.n_image_tokens == 4      # 56x56 max pixels: 4 merged patches, 4 features
    return item, image_id, positions


def test_prompt_image_token_check_fails_both_ways(make_policy, counting_rows):
    """check_image_tokens accepts exactly as many placeholders as feature rows and rejects one fewer and one
    more, naming the row and both counts (a one-sided comparison would let one of these through)."""
    from vlm.prompts import check_image_tokens

    policy = make_policy("qwen2_5_vl")
    item, image_id, positions = _one_item(policy, counting_rows)
    ids = item.input_ids
    check_image_tokens(item, image_id)                        # equal: no error
    cases = {
        3: torch.cat([ids[:positions[0]], ids[positions[0] + 1:]]),                    # one placeholder lost
        5: torch.cat([ids[:positions[-1]], ids[positions[-1]:positions[-1] + 1], ids[positions[-1]:]]),  # one extra
    }
    for n_tokens, bad in cases.items():
        assert int((bad == image_id).sum()) == n_tokens
        item.input_ids = bad
        with pytest.raises(ConfigError, match=rf"^data\.train, row 3: image placeholder tokens in the prompt "
                                              rf"\({n_tokens}\) != image features \(4\) for 1 image\(s\)\. The prompt text may "
                                              r"contain a literal placeholder token, or the processor and model "
                                              r"disagree \(check policy\.processor\)\.$"):
            check_image_tokens(item, image_id)
    item.input_ids = ids
    item.n_image_tokens = 0
    check_image_tokens(item, image_id)
    assert item.n_image_tokens == 4


def test_batch_image_token_check_fails_both_ways(make_policy, counting_rows):
    """The batch check in collate (vlm/batch.py) also catches both directions, naming the bad row and its
    counts: a prompt that lost a placeholder (3 for 4 features) and one that gained one (5 for 4); the
    scoring forward (TokenScorer) runs it too."""
    from vlm.batch import collate, layout_for

    policy = make_policy("qwen2_5_vl")
    tk = policy.p.tokens
    items = policy._prompts(_batch(counting_rows[:2]))
    positions = (items[1].input_ids == tk.image_token_id).nonzero().squeeze(1)
    ids = items[1].input_ids
    collate(items, None, layout_for(items, None), tk.pad_id, tk.image_token_id, "cpu")      # consistent: fine
    for n_tokens, bad in {3: torch.cat([ids[:positions[0]], ids[positions[0] + 1:]]),
                          5: torch.cat([ids[:positions[0]], ids[positions[0]:positions[0] + 1], ids[positions[0]:]])
                          }.items():
        items[1] = dataclasses.replace(items[1], input_ids=bad, token_inputs={})
        with pytest.raises(ConfigError, match=rf"row 1 \(data\.train, row 1\) has {n_tokens} placeholder tokens "
                                              r"for 4 feature rows \(1 bad rows\)"):
            collate(items, None, layout_for(items, None), tk.pad_id, tk.image_token_id, "cpu")
    # the scoring forward runs the same check before the model sees the batch
    comps = [torch.tensor(tk.stop_ids[:1])] * 2
    layout = layout_for(items, comps)
    with pytest.raises(ConfigError, match=r"row \d \(data\.train, row 1\) has 5 placeholder tokens"):
        policy.scorer(items, comps, [layout] * 2, layout.width - layout.prompt_width)


# ---------------------------------------------------------------- left truncation


@pytest.mark.parametrize("cut", [1, 100])
def test_left_truncation_drops_the_earliest_text_only(make_policy, counting_rows, cut):
    """truncation=left with max_prompt_tokens = full length - cut keeps every special/image token and
    exactly the last (text length - cut) text tokens, in order: the kept ids equal the untruncated ids
    with their first `cut` plain-text tokens removed, mm_token_type_ids follow, and the question and the
    format instruction at the end survive intact."""
    question = counting_rows[0]["prompt"]
    row = dict(counting_rows[0], prompt="Look closely. " * 10 + question)
    full_builder = make_policy("qwen2_5_vl", max_prompt_tokens=4096).p.builder
    full = full_builder(row)
    assert not full.truncated
    limit = full.input_ids.numel() - cut
    policy = make_policy("qwen2_5_vl", max_prompt_tokens=limit, truncation="left")
    tok = policy.p.model.tokenizer
    special = set(tok.all_special_ids)
    assert policy.p.tokens.image_token_id in special
    item = policy._prompts(_batch([row]))[0]

    ids, kept = full.input_ids.tolist(), item.input_ids.tolist()
    expected, positions, dropped = [], [], 0
    for i, t in enumerate(ids):                   # drop the first `cut` non-special tokens, keep the rest
        if t not in special and dropped < cut:
            dropped += 1
            continue
        expected.append(t)
        positions.append(i)
    assert item.truncated and len(kept) == limit
    assert kept == expected
    text = [t for t in ids if t not in special]
    assert [t for t in kept if t not in special] == text[cut:]                  # the tail of the text
    assert [t for t in kept if t in special] == [t for t in ids if t in special]
    last_cut = max(set(range(len(ids))) - set(positions))
    assert kept[len(kept) - (len(ids) - last_cut - 1):] == ids[last_cut + 1:]   # everything after the cut
    type_ids = item.token_inputs["mm_token_type_ids"]
    assert torch.equal(type_ids, full.token_inputs["mm_token_type_ids"][positions])
    assert int((type_ids != 0).sum()) == int((item.input_ids == policy.p.tokens.image_token_id).sum()) == 4
    decoded = tok.decode(item.input_ids)
    assert question in decoded and decoded.endswith(tok.decode(full.input_ids[-40:]))
    if cut > 1:
        assert 0 < decoded.count("Look closely.") < 10   # the cut reached into the user's text, from the left


# ---------------------------------------------------------------- algo.max_len_norm


def test_max_len_norm_from_the_config_sets_the_loss(tmp_path):
    """With algo.aggregation=seq-mean-token-sum-norm, the loss of the update step (one on-policy pass, ratio
    1, so per-token loss = -A) is -sum_i A_i len_i / (M * N) with M = algo.max_len_norm as loaded from the
    config, and M = the completion width T when it is unset."""
    from mmrl.loop.collect import StepBatch
    from mmrl.loop.trainer import setup

    def cfg_with(*extra):
        return load_config(VLM_TINY, [f"output_dir={tmp_path}", "eval.every=0", "checkpoint.every=0",
                                      "algo.aggregation=seq-mean-token-sum-norm", "policy.max_new_tokens=6",
                                      *extra])

    configs = {m: cfg_with(f"algo.max_len_norm={m}") for m in (3, 50)}
    configs[None] = cfg_with()
    assert configs[3].algo.max_len_norm == 3 and configs[None].algo.max_len_norm is None
    run = setup(configs[None])
    rows = run.records[:2]
    ro = run.policy.rollout(PromptBatch(rows=rows, index=[0, 1], seeds=[11, 12], step=0), group_size=4)
    n, width = ro.mask.shape
    lengths = ro.mask.sum(1)
    adv = torch.linspace(-0.5, 1.5, n)                     # sum_i A_i len_i != 0 whatever the lengths
    batch = StepBatch(ro, torch.zeros(n, 1), torch.zeros(n), adv, {})
    losses = {}
    for m, cfg in configs.items():
        run.learner.algo = cfg.algo                        # the learner reads only its config sections
        losses[m] = float(run.learner.update(batch, 0)["loss"].value)
    total = float((adv * lengths).sum())
    for m, loss in losses.items():
        assert loss == pytest.approx(-total / ((m or width) * n), rel=1e-5, abs=1e-7), m
    assert abs(losses[3] - losses[50]) > 0.1 * abs(losses[3])


# ---------------------------------------------------------------- chunked scoring


def test_token_scores_chunks_cover_every_position_and_pass_gradients_to_the_head():
    """token_scores over chunks equals one log_softmax over all T positions, also when T exceeds the hidden
    width H (chunks run over positions, never over H); with grad, the checkpointed chunks give the head its
    gradient even when the hidden states do not require grad (a frozen body under a trained head)."""
    from vlm.logprobs import token_scores

    torch.manual_seed(0)
    n, T, H, V = 2, 10, 4, 7
    hidden = torch.randn(n, T, H)                                                       # [n, T, H]
    targets = torch.randint(V, (n, T))                                                  # [n, T]
    head = torch.nn.Linear(H, V, bias=False)
    bias = torch.zeros(V)
    logp_all = torch.log_softmax(head(hidden).detach() / 0.9, -1)                       # [n, T, V]
    with torch.no_grad():
        logp, ent = token_scores(hidden, targets, head, bias, 0.9, None, 3)
    assert logp.shape == ent.shape == (n, T)
    torch.testing.assert_close(logp, logp_all.gather(-1, targets[..., None]).squeeze(-1))
    torch.testing.assert_close(ent, -(logp_all.exp() * logp_all).sum(-1))
    logp_grad, _ = token_scores(hidden, targets, head, bias, 0.9, None, 3)
    logp_grad.sum().backward()
    expected = torch.autograd.grad(torch.log_softmax(head(hidden) / 0.9, -1).gather(-1, targets[..., None]).sum(),
                                   head.weight)[0]
    torch.testing.assert_close(head.weight.grad, expected)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_rows_log_probs_do_not_depend_on_how_many_rows_share_the_call(n):
    """The lm_head runs in matmuls of exactly `chunk` positions: a row scored with n - 1 others gives the
    bits it gives alone. (A CPU with AVX-512 rounded the [1 x 4] and [5 x 4]-position head matmuls of
    a multi-turn view differently, 3e-7 apart, and the on-policy ratio was no longer exactly 1.)"""
    from vlm.logprobs import token_scores

    torch.manual_seed(0)
    T, H, V, chunk = 6, 128, 324, 4
    hidden, targets = torch.randn(5, T, H), torch.randint(V, (5, T))                   # [5, T, H], [5, T]
    head, bias = torch.nn.Linear(H, V, bias=False), torch.zeros(V)
    with torch.no_grad():
        together = token_scores(hidden, targets, head, bias, 1.0, None, chunk)
        part = token_scores(hidden[:n], targets[:n], head, bias, 1.0, None, chunk)
    assert torch.equal(part[0], together[0][:n]) and torch.equal(part[1], together[1][:n])


def test_fresh_features_are_encoded_once_per_prompt_and_equal_the_cached_ones(scoring_case, monkeypatch):
    """When the vision side trains (encode_with_grad), each distinct prompt of a microbatch is encoded once
    (the G rows of a group share it) and the log-probs equal those from the rollout's cached features."""
    import vlm.logprobs as logprobs
    from vlm.logprobs import TokenScorer

    policy, items, comps, _, layout = scoring_case
    hf, tk = policy.p.model.hf, policy.p.tokens
    t = layout.width - layout.prompt_width
    with torch.no_grad():   # as the rollout does: each prompt's features computed once and kept on it
        items = [dataclasses.replace(x, features=logprobs.encode(hf, x.encoder_inputs, "cpu")) for x in items]
    rows, row_comps = [items[0], items[1], items[0]], [comps[0], comps[1], comps[0]]
    with torch.no_grad():
        cached, _ = TokenScorer(hf, tk.blocked, 1.0, 4, tk.pad_id, tk.image_token_id, False)(
            rows, row_comps, [layout] * 3, t)
    encoded = []
    real = logprobs.encode
    monkeypatch.setattr(logprobs, "encode", lambda hf_, inputs, device: encoded.append(id(inputs)) or
                        real(hf_, inputs, device))
    with torch.no_grad():
        fresh, _ = TokenScorer(hf, tk.blocked, 1.0, 4, tk.pad_id, tk.image_token_id, True)(
            rows, row_comps, [layout] * 3, t)
    assert encoded == [id(items[0].encoder_inputs), id(items[1].encoder_inputs)]
    torch.testing.assert_close(fresh, cached, atol=1e-5, rtol=0)


def test_block_bias_covers_blocked_ids_inside_the_vocabulary_and_is_not_saved(scoring_case):
    """Blocked ids at or past the output vocabulary (tokenizer-only added tokens) are ignored, the others get
    BLOCK_BIAS; the bias is derived state, never part of the saved weights (state_dict)."""
    from vlm.logprobs import BLOCK_BIAS, TokenScorer

    policy = scoring_case[0]
    hf, tk = policy.p.model.hf, policy.p.tokens
    vocab = hf.get_output_embeddings().weight.shape[0]
    scorer = TokenScorer(hf, [3, vocab - 1, vocab, vocab + 7], 1.0, 4, tk.pad_id, tk.image_token_id, False)
    assert scorer.block_bias.shape == (vocab,)
    assert torch.nonzero(scorer.block_bias).flatten().tolist() == [3, vocab - 1]
    assert scorer.block_bias[3] == BLOCK_BIAS
    assert not [k for k in scorer.state_dict() if "block_bias" in k]
