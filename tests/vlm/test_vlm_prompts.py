"""Prompt building: format instruction, system prompt, image placement, chat templates of both families."""

from __future__ import annotations

import pytest

from mmrl.types import PromptBatch
from vlm.prompts import R1_INSTRUCTION, build_messages, format_text


def test_format_text():
    assert format_text("Find x.", "r1") == f"Find x.\n{R1_INSTRUCTION}"
    assert format_text("  Find x. \n", "r1") == f"  Find x.\n{R1_INSTRUCTION}"     # only trailing space goes
    assert format_text("Find x.", "none") == "Find x."
    assert format_text("Find x.", "Q: {prompt} A:") == "Q: Find x. A:"
    assert "<think>" in R1_INSTRUCTION and "<answer>" in R1_INSTRUCTION


def test_images_go_to_their_marks_or_first():
    msgs = build_messages("Compare <image> and <image>.", 2, "Be brief.")
    assert msgs[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert msgs[1]["role"] == "user" and len(msgs) == 2
    assert [c["type"] for c in msgs[1]["content"]] == ["text", "image", "text", "image", "text"]
    assert [c["type"] for c in build_messages("Count.", 2, None)[0]["content"]] == ["image", "image", "text"]


@pytest.mark.parametrize("family, image_text", [("qwen2_5_vl", "<|vision_start|><|image_pad|>"), ("llava", "USER: <image>")])
def test_chat_template_places_images(make_policy, family, image_text):
    policy = make_policy(family, system_prompt="You count things.")
    row = {"prompt": "<image> How many?", "images": [_png()], "answer": "1"}
    item = policy._prompts(PromptBatch(rows=[row], index=[0], seeds=[0], step=0))[0]
    text = policy.p.model.tokenizer.decode(item.input_ids)
    assert "You count things." in text and image_text in text and R1_INSTRUCTION[:20] in text
    assert text.index("How many?") > text.index(image_text)
    assert item.n_image_tokens == int((item.input_ids == policy.p.tokens.image_token_id).sum()) > 0


def test_row_system_prompt_wins_and_text_only_rows_work(make_policy):
    policy = make_policy("qwen2_5_vl", system_prompt="global", format_prompt="none", max_new_tokens=2)
    rows = [{"prompt": "Say hi.", "answer": "hi", "system": "local"}]
    ro = policy.rollout(PromptBatch(rows=rows, index=[0], seeds=[0], step=0), group_size=2)
    text = policy.p.model.tokenizer.decode(ro.state["prompt"][0].input_ids)
    assert "local" in text and "global" not in text and R1_INSTRUCTION[:20] not in text
    assert ro.samples[0].images == [] and ro.samples[0].meta["resize"] == []


def _png():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (9, 9, 200)).save(buf, format="PNG")
    return buf.getvalue()


def test_dataloader_workers_prepare_the_same_prompts(make_policy, counting_rows):
    import torch

    from mmrl.config import ConfigError

    batch = PromptBatch(rows=counting_rows[:3], index=[0, 1, 2], seeds=[0] * 3, step=0)
    serial = make_policy("qwen2_5_vl")._prompts(batch)
    policy = make_policy("qwen2_5_vl", image_workers=2)
    parallel = policy._prompts(batch)
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(serial, parallel))
    assert all(torch.equal(a.features.pooled[0], b.features.pooled[0]) for a, b in zip(serial, parallel))
    bad = PromptBatch(rows=counting_rows[:1] + [{"prompt": "x", "images": [b"junk"], "answer": "1"}],
                      index=[0, 9], seeds=[0, 0], step=0)
    with pytest.raises(ConfigError, match=r"^data.train, row 9: image <4 bytes> cannot be decoded"):
        policy._prompts(bad)


def test_processor_outputs_are_sorted_by_consumer_and_meta_keeps_the_extra_columns():
    """_split sends each processor output where the model takes it: a per-token tensor ([1, L, ...], also
    3-D) to token_inputs as [L, ...], a per-image one to image_inputs, encoder keys to encoder_inputs (pixel
    tensors never to the language model), and drops input_ids / attention_mask and non-tensors. meta holds
    the record's extra columns, never prompt, images, answer, system or private `_` keys."""
    import torch

    from mmrl.config import ConfigError
    from vlm.prompts import InputKeys, PromptBuilder, PromptOptions

    L = 6
    enc = {"input_ids": torch.arange(L)[None], "attention_mask": torch.ones(1, L),
           "mm_token_type_ids": torch.zeros(1, L, dtype=torch.long), "rope_deltas": torch.ones(1, L, 3),
           "image_grid_thw": torch.tensor([[1, 2, 2]]), "pixel_values": torch.ones(4, 5), "note": "text"}
    keys = InputKeys(encoder=frozenset({"pixel_values", "image_grid_thw"}),
                     forward=frozenset({"mm_token_type_ids", "rope_deltas", "image_grid_thw", "pixel_values",
                                        "note", "attention_mask"}))
    builder = PromptBuilder(processor=None, resize=None, keys=keys, protected_ids=frozenset())
    rec = {"prompt": "q", "images": ["a.png"], "answer": "2", "system": "s", "_source": "x", "difficulty": 3,
           "id": "r7"}
    item = builder._split(enc, rec, images=["img"], resize=[None])
    assert sorted(item.token_inputs) == ["mm_token_type_ids", "rope_deltas"]
    assert item.token_inputs["rope_deltas"].shape == (L, 3) and item.token_inputs["mm_token_type_ids"].shape == (L,)
    assert sorted(item.image_inputs) == ["image_grid_thw"]
    assert sorted(item.encoder_inputs) == ["image_grid_thw", "pixel_values"]
    assert item.meta == {"difficulty": 3, "id": "r7"}
    assert item.text == "q" and item.row is rec and item.images == ["img"]
    assert not item.truncated and torch.equal(item.input_ids, torch.arange(L))
    short = PromptBuilder(processor=None, resize=None, keys=keys, protected_ids=frozenset(),
                          options=PromptOptions(max_prompt_tokens=4))
    with pytest.raises(ConfigError, match=r"^x, row None: the prompt has 6 tokens"):
        short._split(enc, rec, images=["img"], resize=[None])
    assert builder._split(enc, rec, images=[], resize=[]).encoder_inputs == {}    # text-only: no encoder call


def _bare_builder(**options):
    """A PromptBuilder without a processor, for the steps that need none (record checks, keep masks)."""
    from vlm.prompts import InputKeys, PromptBuilder, PromptOptions

    return PromptBuilder(processor=None, resize=None, keys=InputKeys(frozenset(), frozenset()),
                         protected_ids=frozenset({0, 9}), options=PromptOptions(**options))


def _truncating_builder(limit: int, truncation: str):
    return _bare_builder(max_prompt_tokens=limit, truncation=truncation)


def test_keep_mask_at_the_limits():
    """A prompt exactly at max_prompt_tokens is kept whole in either mode; `left` may drop every text token
    (but never a protected one); one more is an error that counts the tokens and the protected ones, and
    in `error` mode suggests truncation=left."""
    import torch

    from mmrl.config import ConfigError

    ids = torch.tensor([0, 5, 6, 7, 9, 0])               # 0, 9 protected: 3 text tokens
    rec = {"prompt": "q"}
    for mode in ("error", "left"):
        assert bool(_truncating_builder(6, mode)._keep_mask(ids, rec).all())
    assert _truncating_builder(3, "left")._keep_mask(ids, rec).tolist() == [True, False, False, False, True, True]
    assert _truncating_builder(5, "left")._keep_mask(ids, rec).tolist() == [True, False, True, True, True, True]
    with pytest.raises(ConfigError) as err:
        _truncating_builder(2, "left")._keep_mask(ids, rec)
    assert str(err.value) == ("a dataset record: the prompt has 6 tokens (> policy.max_prompt_tokens=2; 3 are "
                              "image placeholders or special tokens that are never cut). Raise "
                              "policy.max_prompt_tokens or lower policy.max_pixels.")
    with pytest.raises(ConfigError) as err:
        _truncating_builder(5, "error")._keep_mask(ids, rec)
    assert str(err.value) == ("a dataset record: the prompt has 6 tokens (> policy.max_prompt_tokens=5; 3 are "
                              "image placeholders or special tokens that are never cut). Set policy.truncation=left "
                              "to drop the earliest text tokens, or raise policy.max_prompt_tokens or lower "
                              "policy.max_pixels.")


def test_record_without_an_answer_is_refused_only_when_answers_are_required():
    """policy.require_answer reaches the record check: an answer-less row is a config error naming the row
    by default, and a valid record when answers are not required (say, a reward that needs no gold)."""
    from mmrl.config import ConfigError

    row = {"prompt": "Describe the picture.", "images": []}
    with pytest.raises(ConfigError, match="missing answer"):
        _truncating_builder(64, "error").record(row)
    assert _bare_builder(require_answer=False).record(row)["prompt"] == "Describe the picture."


class _SpyProcessor:
    """Records how the builder calls a processor; returns three token ids."""

    def __init__(self):
        self.template_kwargs, self.calls = None, []

    def apply_chat_template(self, messages, **kwargs):
        self.template_kwargs = kwargs
        return "TEXT"

    def __call__(self, **kwargs):
        import torch

        self.calls.append(kwargs)
        return {"input_ids": torch.tensor([[1, 2, 3]])}


def test_builder_asks_the_processor_for_the_generation_prompt_and_passes_pixel_bounds_with_images(tmp_path):
    """The chat template is rendered as text (tokenize=False) ending with the assistant's turn
    (add_generation_prompt=True: the model answers, it does not continue the user); the processor's image
    kwargs (Qwen-VL pixel bounds) go with images only; relative image paths resolve under image_root."""
    from PIL import Image

    from vlm.images import ResizePolicy
    from vlm.prompts import InputKeys, PromptBuilder, PromptOptions

    Image.new("RGB", (56, 56), "red").save(tmp_path / "red.png")
    spy = _SpyProcessor()
    builder = PromptBuilder(processor=spy, resize=ResizePolicy(), keys=InputKeys(frozenset(), frozenset()),
                            protected_ids=frozenset(), options=PromptOptions(image_root=str(tmp_path)),
                            image_kwargs={"max_pixels": 3136})
    item = builder({"prompt": "What colour?", "images": ["red.png"], "answer": "red"})
    assert spy.template_kwargs == {"add_generation_prompt": True, "tokenize": False}
    assert spy.calls[-1]["text"] == ["TEXT"] and spy.calls[-1]["max_pixels"] == 3136
    assert len(spy.calls[-1]["images"]) == 1 and item.images[0].size == (56, 56)
    builder({"prompt": "Say hi.", "images": [], "answer": "hi"})
    assert spy.calls[-1]["images"] is None and "max_pixels" not in spy.calls[-1]


def test_prompt_options_from_config_maps_every_key():
    """PromptOptions.from_config copies each policy key to its own field (no shifted or dropped ones)."""
    from types import SimpleNamespace

    from vlm.prompts import PromptOptions

    cfg = SimpleNamespace(system_prompt="sys", format_prompt="none", max_prompt_tokens=77, truncation="left",
                          image_root="/data/images", require_answer=False)
    assert PromptOptions.from_config(cfg) == PromptOptions("sys", "none", 77, "left", "/data/images", False)
    assert PromptOptions.from_config(cfg).image_root == "/data/images"
    assert PromptOptions.from_config(cfg).require_answer is False
