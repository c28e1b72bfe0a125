"""A multi-turn trajectory as the scorer sees it: views of concatenated segments.

A trajectory's actions are its replies' tokens, in turn order: T_i actions for trajectory i, the
columns [0, T_i) of its rows in [N, T]. Each reply is scored in the context it was generated
from. With the whole history kept (env.history_turns = null) every context is a prefix of the next,
so the trajectory is ONE view, scored by one forward with all its images; with only the last K
turns kept, a new view starts whenever the window drops a turn. A view records where its actions
sit in its token sequence and which columns they fill, and the width it is scored at (its length
rounded up to `WIDTH_STEP`, so views of similar length share a batch and each view is always laid
out the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlm.batch import Layout
from vlm.features import concat
from vlm.prompts import PromptInputs, count_features
from vlm.turns import Segment

WIDTH_STEP = 32


@dataclass(eq=False)
class View:
    """One scoring row: `inputs` (the whole token sequence, images included) and its actions.

    positions: [a] positions in `inputs.input_ids` of the model's tokens (the actions).
    column:    the first column of these actions in the trajectory's [T] row.
    layout:    the width this view is laid out at (left-padded), the same at rollout and in training.
    """

    inputs: PromptInputs
    positions: torch.Tensor
    column: int
    layout: Layout


def join(segments: list[Segment], row: dict, actions: set | None = None) -> tuple[PromptInputs, torch.Tensor]:
    """Concatenate segments into one `PromptInputs` (the context the model reads, or a view) and the
    positions [a] of the action segments' tokens in it (`actions`: the ids of the segments to count;
    None = every reply segment)."""
    ids = torch.cat([s.input_ids for s in segments])                                  # [L]
    keys = sorted({k for s in segments for k in s.token_inputs})
    token = {}
    for k in keys:
        dtype = next(s.token_inputs[k].dtype for s in segments if k in s.token_inputs)
        token[k] = torch.cat([s.token_inputs[k] if k in s.token_inputs else torch.zeros(len(s.input_ids), dtype=dtype)
                              for s in segments])                                     # [L] (replies are text: 0)
    image = {k: torch.cat([s.image_inputs[k] for s in segments if k in s.image_inputs])
             for k in sorted({k for s in segments for k in s.image_inputs})}
    encoder = {k: torch.cat([s.encoder_inputs[k] for s in segments if k in s.encoder_inputs])
               for k in sorted({k for s in segments for k in s.encoder_inputs})}
    starts = torch.tensor([0] + [len(s.input_ids) for s in segments]).cumsum(0)       # [S + 1]
    positions = torch.cat([torch.arange(int(starts[i]), int(starts[i + 1]))
                           for i, s in enumerate(segments)
                           if s.action and (actions is None or id(s) in actions)] or [torch.zeros(0, dtype=torch.long)])
    images = [im for s in segments for im in s.images]
    inputs = PromptInputs(ids, token, image, encoder, segments[0].text, images, [], row,
                          features=concat([s.features for s in segments]))
    inputs.n_image_tokens = count_features(inputs.features)
    return inputs, positions


def make_view(segments: list[Segment], row: dict, column: int, actions: set | None = None) -> View:
    """A scoring view of `segments` whose action tokens (see `join`) fill columns from `column` on."""
    inputs, positions = join(segments, row, actions)
    width = -(-len(inputs.input_ids) // WIDTH_STEP) * WIDTH_STEP
    return View(inputs, positions, column, Layout(width, width))


def view_rows(views_per_sample: list[list[View]]) -> tuple[list[View], torch.Tensor]:
    """Flatten the views of n samples into scoring rows; returns the rows and the sample [R] of each."""
    rows = [v for views in views_per_sample for v in views]
    owner = torch.tensor([i for i, views in enumerate(views_per_sample) for _ in views], dtype=torch.long)
    return rows, owner


def score_views(scorer, views_per_sample: list[list[View]], out_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies [n, out_len] of each trajectory's actions, one forward per view (batched by
    layout); a trajectory's views fill disjoint columns, so the rows add up to its row."""
    rows, owner = view_rows(views_per_sample)
    n = len(views_per_sample)
    lp, en = scorer([v.inputs for v in rows], None, [v.layout for v in rows], out_len,
                    actions=[(v.positions, v.column) for v in rows])                   # [R, T]
    owner = owner.to(lp.device)
    zeros = lp.new_zeros(n, out_len)
    return zeros.index_add(0, owner, lp), zeros.index_add(0, owner, en)                # [n, T]
