"""Saved LoRA weights load back with diffusers' `load_lora_weights` and give the trained model's
output; checkpoints (LoRA and full fine-tuning) load back into a fresh policy."""

import importlib

import pytest
import torch

from diffusion import tiny

PIPELINES = {"sd3": "StableDiffusion3Pipeline", "sd": "StableDiffusionPipeline", "flux": "FluxPipeline",
             "wan": "WanPipeline"}


def _output(policy, model):
    """The denoiser output on fixed rows (no CFG), through the family's own call."""
    fam = policy.family
    x = fam.noise(2, torch.Generator().manual_seed(0))
    cond = list(policy.encode(["a red circle"]).values()) * 2
    rows = fam.model_rows(x, torch.tensor([0, 2]), cond, policy.sched, 3.5)
    with torch.no_grad():
        return fam.forward(model, rows)


def _fresh_pipeline(kind):
    cls = getattr(importlib.import_module("diffusers"), PIPELINES[kind])
    return cls.from_pretrained(tiny.ensure(kind))


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_load_lora_weights_round_trip(kind, tmp_path, build_tiny, perturb_lora):
    policy = build_tiny(kind)
    perturb_lora(policy)
    trained = _output(policy, policy.denoiser)
    policy.save(str(tmp_path / "policy.safetensors"))           # the checkpoint file itself
    policy.export_lora(str(tmp_path / "export"))                # a standard LoRA folder
    for load in (lambda p: p.load_lora_weights(str(tmp_path), weight_name="policy.safetensors"),
                 lambda p: p.load_lora_weights(str(tmp_path / "export"))):
        pipe = _fresh_pipeline(kind)
        denoiser = pipe.unet if kind == "sd" else pipe.transformer
        base = _output(policy, denoiser)
        load(pipe)
        loaded = _output(policy, denoiser)
        assert not torch.allclose(base, trained)
        torch.testing.assert_close(loaded, trained, rtol=1e-4, atol=1e-5)  # rank and alpha respected


def test_lora_checkpoint_resumes_into_a_fresh_policy(tmp_path, build_tiny, perturb_lora):
    policy = build_tiny("sd3")
    perturb_lora(policy)
    policy.save(str(tmp_path / "policy.safetensors"))
    fresh = build_tiny("sd3", seed=5)
    fresh.load(str(tmp_path / "policy.safetensors"))
    assert torch.equal(_output(fresh, fresh.denoiser), _output(policy, policy.denoiser))


def test_full_finetune_checkpoint_round_trip(tmp_path, build_tiny):
    policy = build_tiny("sd3", "lora.rank=0")
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.01)
    policy.save(str(tmp_path / "policy.safetensors"))
    fresh = build_tiny("sd3", "lora.rank=0", kl_beta=0.1)            # a KL: the frozen reference copy is kept
    fresh.load(str(tmp_path / "policy.safetensors"))
    assert torch.equal(_output(fresh, fresh.denoiser), _output(policy, policy.denoiser))
    assert not torch.equal(_output(fresh, fresh.reference_model), _output(fresh, fresh.denoiser))


def test_wrong_adapter_shape_is_a_clear_error(tmp_path, build_tiny):
    policy = build_tiny("sd3")
    policy.save(str(tmp_path / "policy.safetensors"))
    other = build_tiny("sd3", "lora.rank=2")
    with pytest.raises(Exception, match="size mismatch|does not match"):
        other.load(str(tmp_path / "policy.safetensors"))


def test_a_checkpoints_policy_ema_file_loads_in_diffusers_as_the_average(tmp_path, build_tiny, perturb_lora):
    """With an EMA (train.ema_decay) a checkpoint also holds policy_ema.safetensors: the averaged LoRA in the
    same diffusers format, so `load_lora_weights` gives the averaged model, not the trained one."""
    from mmrl.state import checkpoint
    from mmrl.loop.ema import EMA

    policy = build_tiny("sd3")
    params = policy.trainable_parameters()
    ema = EMA(params, 0.5, warmup=False)
    perturb_lora(policy)
    ema.update()                                                 # the average: half way to the perturbed LoRA
    optimizer = torch.optim.AdamW(params)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    path = checkpoint.save(str(tmp_path), 1, policy, optimizer, scheduler, {}, ema=ema)
    trained = _output(policy, policy.denoiser)
    with ema.swapped_in():
        averaged = _output(policy, policy.denoiser)
    pipe = _fresh_pipeline("sd3")
    pipe.load_lora_weights(path, weight_name="policy_ema.safetensors")
    loaded = _output(policy, pipe.transformer)
    assert not torch.allclose(averaged, trained)
    torch.testing.assert_close(loaded, averaged, rtol=1e-4, atol=1e-5)
