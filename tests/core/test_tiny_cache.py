"""One tiny-model cache (mmrl/testing/tiny.py) for both adapters' `tiny:<name>` builders: $MMRL_TINY_CACHE
when set, else one default folder; a folder is built once, atomically."""

import os

import pytest

from diffusion import tiny as diffusion_tiny
from mmrl.testing import tiny
from vlm import tiny as vlm_tiny


def test_both_adapters_use_the_same_default_cache(monkeypatch):
    monkeypatch.delenv(tiny.CACHE_ENV, raising=False)
    default = os.path.expanduser(os.path.join("~", ".cache", "mmrl", "tiny"))
    assert tiny.cache_root() == default
    assert os.path.dirname(vlm_tiny.folder_of("qwen2_5_vl")) == default
    assert os.path.dirname(diffusion_tiny.folder_of("sd3")) == default
    monkeypatch.setenv(tiny.CACHE_ENV, "")                     # empty means unset
    assert tiny.cache_root() == default


@pytest.mark.slow
def test_both_adapters_build_into_the_env_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(tiny.CACHE_ENV, str(tmp_path))
    sd3 = diffusion_tiny.resolve("tiny:sd3")
    qwen = vlm_tiny.resolve_model("tiny:qwen2_5_vl")
    assert os.path.dirname(sd3) == os.path.dirname(qwen) == str(tmp_path)
    assert os.path.isfile(os.path.join(sd3, "model_index.json"))
    assert os.path.isfile(os.path.join(qwen, "model.safetensors"))
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(sd3), os.path.basename(qwen)])  # no temp left
    assert diffusion_tiny.resolve("tiny:sd3") == sd3 and vlm_tiny.resolve_model("tiny:qwen2_5_vl") == qwen


def _has_marker(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "done"))


def _write_marker(folder: str) -> None:
    with open(os.path.join(folder, "done"), "w") as f:
        f.write("x")


def test_build_once_builds_a_missing_folder_and_reuses_a_complete_one(tmp_path):
    calls = []

    def build(tmp):
        calls.append(tmp)
        _write_marker(tmp)

    folder = str(tmp_path / "model")
    assert tiny.build_once(folder, build, _has_marker, "tiny:test") == folder and _has_marker(folder)
    tiny.build_once(folder, build, _has_marker, "tiny:test")
    assert len(calls) == 1 and os.listdir(tmp_path) == ["model"]


def test_build_once_rejects_an_incomplete_build_and_cleans_up(tmp_path):
    with pytest.raises(RuntimeError, match="building tiny:test into .* left it incomplete"):
        tiny.build_once(str(tmp_path / "model"), lambda tmp: None, _has_marker, "tiny:test")
    assert os.listdir(tmp_path) == []


def test_unknown_tiny_names_are_config_errors(monkeypatch, tmp_path):
    monkeypatch.setenv(tiny.CACHE_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="unknown tiny model 'tiny:nope'"):
        diffusion_tiny.resolve("tiny:nope")
    with pytest.raises(ValueError, match="policy.model"):
        vlm_tiny.resolve_model("tiny:nope")
    assert os.listdir(tmp_path) == []
