"""Encoder outputs are kept per prompt and merged back in the model's own layout for any batch."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlm.features import merge, slim


def test_sequence_outputs_concatenate_in_row_order():       # Qwen-VL, LLaVA, Idefics3
    a = slim(BaseModelOutputWithPooling(last_hidden_state=torch.zeros(9, 2), pooler_output=(torch.ones(3, 4),)))
    b = slim(BaseModelOutputWithPooling(pooler_output=[torch.full((2, 4), 2.0), torch.full((1, 4), 3.0)]))
    out = merge([b, None, a, b])["image"]
    assert isinstance(out, BaseModelOutputWithPooling) and out.last_hidden_state is None
    assert [float(t[0, 0]) for t in out.pooler_output] == [2.0, 3.0, 1.0, 2.0, 3.0]
    assert merge([None, None]) is None


def test_stacked_outputs_stay_stacked():                      # Gemma 3: one [n, tokens, hidden] tensor
    a = slim(BaseModelOutputWithPooling(pooler_output=torch.zeros(2, 5, 4)))
    b = slim(BaseModelOutputWithPooling(pooler_output=torch.ones(1, 5, 4)))
    out = merge([a, b])["image"].pooler_output
    assert isinstance(out, torch.Tensor) and out.shape == (3, 5, 4) and float(out[2].sum()) == 20.0


def test_deepstack_features_concatenate_per_layer():          # Qwen3-VL
    from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures as Out

    a = slim(Out(pooler_output=(torch.zeros(2, 4),), deepstack_features=[torch.zeros(2, 4), torch.ones(2, 4)]))
    b = slim(Out(pooler_output=(torch.zeros(3, 4),), deepstack_features=[torch.zeros(3, 4), torch.ones(3, 4)]))
    out = merge([a, b])["image"]
    assert type(out) is Out and [t.shape[0] for t in out.deepstack_features] == [5, 5]
