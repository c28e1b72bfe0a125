"""Two CPU processes (gloo) launched through accelerate train the bandit like one process."""

import os
import sys

import pytest
import torch

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")
ARGS = ["max_steps=6", "train.prompts_per_step=4", "train.update_epochs=1", "eval.every=0",
        "optim.eps=1.0", "logging.progress=false", "train.ema_decay=0.9"]


@pytest.mark.slow
@pytest.mark.integration
def test_two_processes_match_one_and_stay_in_sync(tmp_path, free_port, read_metrics, run_side_by_side):
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    two = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           WORKER, str(tmp_path / "two.pt"), f"output_dir={tmp_path / 'two'}", *ARGS]
    one = [sys.executable, WORKER, str(tmp_path / "one.pt"), f"output_dir={tmp_path / 'one'}", *ARGS]
    run_side_by_side([(two, {**os.environ, "CUDA_VISIBLE_DEVICES": ""}), (one, None)], timeout=300)
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert (a["world"], b["world"]) == (1, 2)
    rank0, rank1 = b["thetas"]
    assert torch.equal(rank0, rank1)                              # DDP keeps ranks identical
    assert (a["thetas"][0].abs().max()) > 1e-2                    # training moved the parameters
    torch.testing.assert_close(rank0, a["thetas"][0], rtol=0, atol=1e-5)
    ema0, ema1 = b["averages"]                                    # the EMA (train.ema_decay) too
    assert torch.equal(ema0, ema1) and not torch.equal(ema0, rank0)
    torch.testing.assert_close(ema0, a["averages"][0], rtol=0, atol=1e-5)
    rows_one, rows_two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_two] == [1, 2, 3, 4, 5, 6]
    for r1, r2 in zip(rows_one, rows_two, strict=True):
        assert r1["reward/mean"] == pytest.approx(r2["reward/mean"], abs=1e-6)
