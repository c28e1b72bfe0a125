"""benchmarks/memory_estimates.py: its bytes-per-parameter arithmetic on a hand-sized model, and its
layer-size counts against the model cards' totals."""

import importlib.util
import os
import sys

import pytest

from tests import REPO

MEMORY_ESTIMATES = os.path.join(REPO, "benchmarks", "memory_estimates.py")


@pytest.fixture(scope="module")
def est():
    spec = importlib.util.spec_from_file_location("memory_estimates", MEMORY_ESTIMATES)
    module = importlib.util.module_from_spec(spec)
    sys.modules["memory_estimates"] = module        # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("memory_estimates", None)


@pytest.fixture
def toy(est):
    # 1000 trained params: 4 blocks of 200 and a root of 200; 100 frozen; 10 LoRA params
    return est.Model("toy", 1000.0, ((4, 200.0),), (("encoder", 100.0),), 10.0)


def test_ddp_lora_is_bf16_everything_plus_16_bytes_per_lora_param(est, toy):
    assert est.ddp_lora_bytes(toy) == {"trained states": 160.0, "bf16 weights": 2000.0, "frozen bf16": 200.0}


def test_fsdp_shards_16_bytes_per_param_and_gathers_root_plus_two_blocks(est, toy):
    assert toy.root == 200.0 and toy.block == 200.0
    for n in (1, 4, 8):
        parts = est.fsdp_full_bytes(toy, n)
        assert parts["trained states"] == 16 * 1000 / n
        assert parts["bf16 weights"] == 2 * (200 + 2 * 200)             # does not shrink with N
        assert parts["frozen bf16"] == 200.0                              # replicated
    assert est.fsdp_full_bytes(toy, 16)["trained states"] * 2 == est.fsdp_full_bytes(toy, 8)["trained states"]


def test_layer_counts_agree_with_the_model_cards(est):
    by_name = {m.name: m for m in est.MODELS}
    # what is left of the card's total outside the decoder layers is the embeddings (Qwen2.5-VL config sizes)
    assert by_name["Qwen2.5-VL-3B"].root == pytest.approx(151936 * 2048, rel=0.03)          # tied
    assert by_name["Qwen2.5-VL-7B"].root == pytest.approx(2 * 152064 * 3584, rel=0.03)      # embeddings + lm_head
    for m in est.MODELS:   # LoRA r64 on attention (and Wan's and FLUX's MLPs): a few % of the network
        assert 0 < m.root < 0.15 * m.trained and 0 < m.lora < 0.07 * m.trained, m.name
    assert by_name["FLUX.1-dev"].block == pytest.approx(36 * 3072 ** 2)
    # Wan 2.1 1.3B: 30 blocks of 46.4M (8 x 1536^2 attention + 2 x 1536 x 8960 MLP); ~26M of embeddings left
    assert by_name["Wan2.1-T2V-1.3B"].block == pytest.approx(46.4e6, rel=1e-3)
    assert by_name["Wan2.1-T2V-1.3B"].root == pytest.approx(26e6, rel=0.15)


def test_the_script_prints_a_marked_table_and_a_headline(est, capsys):
    assert est.main(["--gpus", "1", "8"]) == 0
    out = capsys.readouterr().out
    assert "estimates, not measured" in out and out.rstrip().splitlines()[-1].startswith("headline: ")
    assert out.count("| FLUX.1-dev |") == 3                              # DDP + LoRA, N=1, N=8
