"""No checkpoint file runs code when loaded: a crafted pickle in optimizer.pt, scheduler.pt, rng.pt or a sharded
checkpoint's .metadata is refused with an error naming the file, before it can execute; the RNG states are stored
as tensors and plain containers (weights-only readable), and an RNG file of the older numpy form still resumes."""

import os
import pickle
import random

import numpy as np
import pytest
import torch

from mmrl.state import checkpoint
from mmrl.state.checkpoint import rng_state, set_rng_state
from mmrl.state.safe_load import UnsafeCheckpoint, load_pt, read_dcp_metadata, safe_reader
from mmrl.loop.trainer import setup


class _Payload:
    """Unpickling it creates `marker` (a stand-in for arbitrary code)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def _checkpoint(run_bandit, tmp_path) -> str:
    run_bandit(tmp_path, "max_steps=2", "checkpoint.every=2", "eval.every=0")
    path = os.path.join(tmp_path, "checkpoints", "step_000002")
    assert os.path.isdir(path)
    return path


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng.pt"])
def test_a_crafted_pickle_in_a_checkpoint_file_is_refused_naming_it(tmp_path, name, run_bandit, bandit_cfg):
    path = _checkpoint(run_bandit, tmp_path / "run")
    marker = str(tmp_path / "ran")
    torch.save({"state": _Payload(marker)}, os.path.join(path, name))
    with pytest.raises(UnsafeCheckpoint, match=rf"checkpoint file '.*{name}' is not a plain weights file"):
        setup(bandit_cfg(tmp_path / "run", "max_steps=4", "resume=auto", "eval.every=0"))
    assert not os.path.exists(marker)


def test_the_rng_file_is_weights_only_and_restores_every_generator(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()                                            # a cached Gaussian in numpy's state
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.normal(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_pt(str(tmp_path / "rng.pt")))              # no numpy allowance needed
    assert (random.random(), np.random.normal()) == expected[:2] and torch.equal(torch.rand(3), expected[2])


def test_an_rng_file_of_the_older_numpy_form_still_resumes(tmp_path):
    random.seed(4), np.random.seed(5), torch.manual_seed(6)
    legacy = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(legacy, tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), torch.rand(2))
    with pytest.raises(UnsafeCheckpoint, match="rng.pt"):
        load_pt(str(tmp_path / "rng.pt"))                          # numpy arrays only where asked for
    set_rng_state(load_pt(str(tmp_path / "rng.pt"), legacy_numpy=True))
    assert (random.random(), float(np.random.rand())) == expected[:2] and torch.equal(torch.rand(2), expected[2])


def test_sharded_metadata_is_read_with_only_checkpoint_classes(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = str(tmp_path / "sharded")
    dcp.save({"w": torch.arange(6.0).view(2, 3), "step": torch.tensor(3)}, checkpoint_id=folder, no_dist=True)
    meta = read_dcp_metadata(os.path.join(folder, ".metadata"))
    assert set(meta.state_dict_metadata) == {"w", "step"}
    back = {"w": torch.zeros(2, 3), "step": torch.tensor(0)}
    dcp.load(back, storage_reader=safe_reader(folder), no_dist=True)
    assert torch.equal(back["w"], torch.arange(6.0).view(2, 3)) and int(back["step"]) == 3
    marker = str(tmp_path / "ran")
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        pickle.dump(_Payload(marker), f)
    with pytest.raises(UnsafeCheckpoint, match=r"\.metadata' is not a plain weights file: its metadata imports "
                                               r"(builtins|io)\.open"):
        safe_reader(folder)
    assert not os.path.exists(marker)


class _NotWeights:
    """An arbitrary pickled object: `torch.load(weights_only=True)` must refuse to run its code."""


def test_optimizer_and_scheduler_states_are_loaded_as_weights_only(tmp_path, save_bandit, bandit_objects):
    """A checkpoint's optimizer.pt and scheduler.pt are read with weights_only=True: a file holding arbitrary
    pickled objects is refused instead of executed, with an error naming the file."""
    path = save_bandit(tmp_path, 2)
    torch.save({"state": {}, "param_groups": [], "payload": _NotWeights()}, os.path.join(path, "optimizer.pt"))
    with pytest.raises(UnsafeCheckpoint, match=r"optimizer\.pt' is not a plain weights file: .*_NotWeights"):
        checkpoint.load(path, *bandit_objects(0.0))
    path = save_bandit(tmp_path / "again", 2)
    torch.save({"base_lrs": [0.1], "payload": _NotWeights()}, os.path.join(path, "scheduler.pt"))
    with pytest.raises(UnsafeCheckpoint, match=r"scheduler\.pt' is not a plain weights file: .*_NotWeights"):
        checkpoint.load(path, *bandit_objects(0.0))
