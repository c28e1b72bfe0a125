"""Rollout-time prompt preparation: a PromptBatch's rows -> `PromptInputs`, in DataLoader workers."""

from __future__ import annotations

import torch

from mmrl.config import ConfigError
from vlm.data import ROW_KEY, SOURCE_KEY
from vlm.prompts import PromptBuilder


class _Rows(torch.utils.data.Dataset):
    """A rollout's rows; items are `PromptInputs`, or the error a bad row raised (re-raised by the caller)."""

    def __init__(self, rows: list, builder: PromptBuilder):
        self.rows, self.builder = rows, builder

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        try:
            return self.builder(self.rows[i])
        except ConfigError as e:
            return e


def _identity(item):
    return item


def prepare_rows(prompts, builder: PromptBuilder, workers: int) -> list:
    """`PromptInputs` for every row of a PromptBatch (provenance tagged for error messages)."""
    source = "data.eval" if prompts.step < 0 else "data.train"
    rows = [{SOURCE_KEY: source, ROW_KEY: i, **row} for row, i in zip(prompts.rows, prompts.index)]
    dataset = _Rows(rows, builder)
    if workers > 0 and len(rows) > 1:
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False,
                                             num_workers=min(workers, len(rows)), collate_fn=_identity)
        items = list(loader)
    else:
        items = [dataset[i] for i in range(len(dataset))]
    for item in items:
        if isinstance(item, Exception):
            raise item
    return items
