"""`mmrl export`: a tiny run's checkpoint becomes folders that transformers / peft / diffusers load, holding
exactly the checkpoint's weights; user errors exit 2 naming the path."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mmrl.cli import main
from tests import REPO

VLM = os.path.join(REPO, "configs", "tiny", "vlm_tiny.yaml")
SD3 = os.path.join(REPO, "configs", "tiny", "sd3_tiny.yaml")
FAST_VLM = ("max_steps=2", "eval.every=0", "checkpoint.every=0", "train.group_size=2", "policy.max_new_tokens=4")
FAST_SD3 = ("max_steps=2", "eval.every=0", "checkpoint.every=0", "train.group_size=2", "algo.kl_beta=0")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(out_dir, config: str, *overrides: str) -> str:
    from mmrl.config import load_config
    from mmrl.loop.trainer import train

    return train(load_config(config, [f"output_dir={out_dir}", *overrides]))


def _export(*args: str) -> int:
    return main(["export", *map(str, args)])


def _run(factory, name: str, config: str, *overrides: str) -> str:
    return _train(factory.mktemp(name) / "run", config, *overrides)


@pytest.fixture(scope="module")
def vlm_lora(tmp_path_factory):
    return _run(tmp_path_factory, "vlm_lora", VLM, *FAST_VLM)


@pytest.fixture(scope="module")
def vlm_full(tmp_path_factory):
    return _run(tmp_path_factory, "vlm_full", VLM, *FAST_VLM, "policy.lora.rank=0")


@pytest.fixture(scope="module")
def sd3_lora(tmp_path_factory):
    return _run(tmp_path_factory, "sd3_lora", SD3, *FAST_SD3, "train.ema_decay=0.5", "train.ema_warmup=false")


@pytest.fixture(scope="module")
def sd3_full(tmp_path_factory):
    return _run(tmp_path_factory, "sd3_full", SD3, *FAST_SD3, "policy.lora.rank=0")


def _checkpoint(run: str, name: str = "policy.safetensors") -> dict:
    return load_file(os.path.join(run, "checkpoints", "step_000002", name))


def _base_vlm():
    from transformers import AutoModelForImageTextToText

    from vlm.tiny import resolve_model

    return AutoModelForImageTextToText.from_pretrained(resolve_model("tiny:qwen2_5_vl"), dtype=torch.float32)


def test_vlm_lora_exports_a_peft_adapter_and_a_merged_model(vlm_lora, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "export"
    assert _export(vlm_lora, out) == 0
    assert f"exported to {out}" in capsys.readouterr().out
    trained = _checkpoint(vlm_lora)
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in trained.items())          # training moved the LoRA
    peft_model = PeftModel.from_pretrained(_base_vlm(), str(out))
    for name, value in trained.items():
        assert torch.equal(peft_model.base_model.model.get_parameter(name), value), name
    merged = AutoModelForImageTextToText.from_pretrained(str(out / "merged"))
    expected = peft_model.merge_and_unload().state_dict()
    base = _base_vlm().state_dict()
    got = merged.state_dict()
    assert set(got) == set(expected)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0)
    assert any(not torch.equal(got[k], base[k]) for k in base)                            # the LoRA is in it
    assert AutoProcessor.from_pretrained(str(out)).tokenizer is not None
    AutoProcessor.from_pretrained(str(out / "merged"))
    manifest = json.loads((out / "mmrl_export.json").read_text())
    assert manifest == {"source": os.path.join(vlm_lora, "checkpoints", "step_000002"), "step": 2, "ema": False,
                        "policy": "vlm", "model": "tiny:qwen2_5_vl", "name": "policy"}
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_vlm_full_finetune_exports_a_transformers_folder(vlm_full, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    ckpt = os.path.join(vlm_full, "checkpoints", "step_000002")
    assert _export(ckpt, tmp_path / "export") == 0                                          # a checkpoint folder
    model = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "export"))
    trained, base = _checkpoint(vlm_full), _base_vlm()
    assert any(not torch.equal(base.get_parameter(k), v) for k, v in trained.items())
    for name, value in trained.items():
        assert torch.equal(model.get_parameter(name), value), name
    AutoProcessor.from_pretrained(str(tmp_path / "export"))


def _lora_of(denoiser) -> dict:
    from peft.utils import get_peft_model_state_dict

    (adapter,) = denoiser.peft_config
    return get_peft_model_state_dict(denoiser, adapter_name=adapter)


@pytest.mark.parametrize("ema", [False, True])
def test_diffusion_lora_exports_a_diffusers_lora_folder(sd3_lora, tmp_path, ema):
    from diffusers import StableDiffusion3Pipeline

    from diffusion import tiny

    assert _export(sd3_lora, tmp_path / "export", *(["--ema"] if ema else [])) == 0
    pipe = StableDiffusion3Pipeline.from_pretrained(tiny.ensure("sd3"))
    pipe.load_lora_weights(str(tmp_path / "export"))
    saved = _checkpoint(sd3_lora, "policy_ema.safetensors" if ema else "policy.safetensors")
    expected = {k[len("transformer."):]: v for k, v in saved.items()}
    loaded = _lora_of(pipe.transformer)
    assert set(loaded) == set(expected)
    for k, v in expected.items():
        assert torch.equal(loaded[k], v), k
    assert json.loads((tmp_path / "export" / "mmrl_export.json").read_text())["ema"] is ema
    if ema:                                                       # the average is not the trained weights
        assert any(not torch.equal(v, _checkpoint(sd3_lora)[k]) for k, v in saved.items())


def test_diffusion_full_finetune_exports_the_denoiser(sd3_full, tmp_path):
    from diffusers import SD3Transformer2DModel

    from diffusion import tiny

    assert _export(sd3_full, tmp_path / "export") == 0
    model = SD3Transformer2DModel.from_pretrained(str(tmp_path / "export"))
    base = SD3Transformer2DModel.from_pretrained(tiny.ensure("sd3"), subfolder="transformer").state_dict()
    trained, got = _checkpoint(sd3_full), model.state_dict()
    assert set(got) == set(trained)
    assert any(not torch.equal(trained[k], base[k]) for k in trained)
    for k, v in trained.items():
        assert torch.equal(got[k], v), k


def test_diffusion_nft_exports_the_trained_weights_not_the_old_copy(tmp_path_factory, tmp_path):
    from diffusers import SD3Transformer2DModel

    run = _run(tmp_path_factory, "sd3_nft", SD3, *FAST_SD3, "policy.lora.rank=0", "algo.objective=nft",
               "algo.nft.timesteps=2", "algo.nft.old_decay_rate=0.25")
    assert _export(run, tmp_path / "export") == 0
    got = SD3Transformer2DModel.from_pretrained(str(tmp_path / "export")).state_dict()
    trained, old = _checkpoint(run), _checkpoint(run, "policy.nft_old.safetensors")
    assert all(torch.equal(got[k], v) for k, v in trained.items())
    assert any(not torch.equal(got[k], v) for k, v in old.items())


def _user_error(capsys, code: int, *needles: str) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)


def test_missing_config_and_missing_checkpoint_are_user_errors(sd3_full, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(os.path.join(sd3_full, "checkpoints"), run / "checkpoints")             # no config.yaml
    _user_error(capsys, _export(run, tmp_path / "a"), str(run / "config.yaml"))
    _user_error(capsys, _export(run / "checkpoints" / "step_000002", tmp_path / "b"), str(run / "config.yaml"))
    empty = tmp_path / "empty"
    empty.mkdir()
    _user_error(capsys, _export(empty, tmp_path / "c"), str(empty), "no complete checkpoint")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_non_empty_out_dir_and_ema_without_ema_are_user_errors(vlm_lora, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    _user_error(capsys, _export(vlm_lora, out), str(out), "not an empty folder")
    assert os.listdir(out) == ["keep.txt"]
    ckpt = os.path.join(vlm_lora, "checkpoints", "step_000002")
    _user_error(capsys, _export(vlm_lora, tmp_path / "ema", "--ema"), ckpt, "policy_ema.safetensors")
    assert not (tmp_path / "ema").exists()


def test_bandit_policy_has_no_library_export(tmp_path, capsys, bandit_config):
    run = _train(tmp_path / "run", bandit_config, "max_steps=1", "eval.every=0")
    _user_error(capsys, _export(run, tmp_path / "out"), "no library export")
    assert sorted(os.listdir(tmp_path)) == ["run"]                                         # no partial folder


def test_vlm_lora_export_leaves_the_live_policy_unmerged(vlm_lora, tmp_path):
    from mmrl.config import load_config
    from mmrl.state.export import build_cpu_policy, load_weights

    policy = build_cpu_policy(load_config(os.path.join(vlm_lora, "config.yaml"), []))
    load_weights(os.path.join(vlm_lora, "checkpoints", "step_000002"), policy, ema=False)
    before = {k: v.clone() for k, v in policy.p.model.hf.state_dict().items()}
    policy.export(str(tmp_path))
    after = policy.p.model.hf.state_dict()
    assert set(after) == set(before) and any("lora_B" in k for k in after)
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert not any(getattr(m, "merged", False) for m in policy.p.model.hf.modules())
