"""mmrl.distributed.determinism: weights re-homed at aligned addresses (keeping Parameters and ties), fixed-row batching,
every model the adapters and rewards load aligned, and the kernel-limiting settings."""

import pytest
import torch

from mmrl.distributed.determinism import ALIGNMENT, ISA_LIMITS, align_weights, fixed_rows, isa_env, lower_isa, misaligned


def _misaligned_linear() -> torch.nn.Linear:
    """A Linear whose weight is a view 8 bytes into a buffer (as safetensors loads can leave it)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    buf = torch.empty(16 * 32 + 2)
    view = buf[2:].view(16, 32)
    view.copy_(lin.weight.detach())
    lin.weight.data = view
    return lin


def test_align_weights_moves_a_misaligned_weight_and_keeps_its_parameter_and_values():
    lin = _misaligned_linear()
    param, before = lin.weight, lin.weight.detach().clone()
    assert misaligned(lin) == ["weight"]
    assert align_weights(lin) is lin
    assert misaligned(lin) == []
    assert lin.weight is param and lin.weight.data_ptr() % ALIGNMENT == 0
    assert torch.equal(lin.weight, before)
    x = torch.randn(3, 32)
    fresh = torch.nn.functional.linear(x, before.clone(), lin.bias)  # an aligned copy computes the same bits
    assert torch.equal(lin(x), fresh)


def test_align_weights_keeps_tied_and_shared_weights_shared():
    emb, head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10, bias=False)
    buf = torch.empty(10 * 8 + 1)
    head.weight.data = buf[1:].view(10, 8)
    emb.weight = head.weight                                  # tied: one Parameter in two modules
    other = torch.nn.Linear(8, 10, bias=False)
    other.weight.data = buf[1:].view(10, 8)                   # another Parameter over the same bytes
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "other": other})
    align_weights(model)
    assert emb.weight is head.weight
    assert other.weight.data_ptr() == head.weight.data_ptr() and head.weight.data_ptr() % ALIGNMENT == 0
    assert misaligned(model) == []


def test_fixed_rows_calls_with_exactly_rows_items_and_keeps_order():
    calls = []

    def fn(batch):
        calls.append(list(batch))
        return [10 * b for b in batch]

    assert fixed_rows(fn, [1, 2, 3, 4, 5], 3) == [10, 20, 30, 40, 50]
    assert calls == [[1, 2, 3], [4, 5, 4]]                    # the last call padded with copies of its first item
    assert fixed_rows(fn, [], 3) == []
    with pytest.raises(ValueError, match="rows per call"):
        fixed_rows(fn, [1], 0)
    with pytest.raises(ValueError, match="returned 1 results for 2 items"):
        fixed_rows(lambda b: b[:1], [1, 2], 2)


def test_image_rewards_score_in_calls_of_exactly_batch_size():
    from PIL import Image

    from rewards.builtin.clip import _image_reward
    from rewards.sample import Sample

    sizes = []

    def score(batch):
        sizes.append(len(batch))
        return [float(s.meta["v"]) for s in batch]

    reward = _image_reward("probe", score, batch_size=4)
    image = Image.new("RGB", (4, 4))
    samples = [Sample("p", image if i != 2 else "text", meta={"v": i}, id=str(i)) for i in range(7)]
    assert reward(samples) == [0.0, 1.0, None, 3.0, 4.0, 5.0, 6.0]
    assert sizes == [4, 4]


def test_the_tiny_diffusion_pipeline_loads_with_every_weight_aligned():
    from diffusion import families, tiny

    opts = families.FamilyOptions(device="cpu", dtype=torch.float32, max_sequence_length=8)
    family = families.load("sd3", tiny.resolve("tiny:sd3"), opts)
    parts = [*family.text_encoders(), family.pipe.vae, family.denoiser]
    assert {type(m).__name__: misaligned(m) for m in parts} == {type(m).__name__: [] for m in parts}


def test_the_tiny_vlm_loads_with_every_weight_aligned():
    from vlm.model import load_model
    from vlm.policy import Config

    hf = load_model(Config(model="tiny:qwen2_5_vl"), "cpu", torch.float32)
    assert misaligned(hf) == []


def test_kernel_limits_name_the_three_libraries_and_refuse_an_unknown_set():
    assert lower_isa() in ISA_LIMITS
    for limits in ISA_LIMITS.values():
        assert set(limits) == {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"}
    env = isa_env("avx2", {"PATH": "/bin"})
    assert env == {"PATH": "/bin", **ISA_LIMITS["avx2"]}
    with pytest.raises(ValueError, match="avx2, default"):
        isa_env("avx9")
