"""benchmarks/gpu_check.py on CPU: its metrics.jsonl summary, its command lines, and its refusal
to run without CUDA (the runs themselves need a GPU and are not run here)."""

import importlib.util
import json
import os
import sys

import pytest

from tests import REPO

GPU_CHECK = os.path.join(REPO, "benchmarks", "gpu_check.py")


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module               # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def _write(path, rows: list) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def test_median_after_the_first_step_and_peaks(gpu_check, tmp_path):
    state = {"mem/params_bytes": 100, "mem/grads_bytes": 10, "mem/optim_bytes": 20}
    rows = [{"step": 0, "eval/reward/mean": 0.5},                                   # eval row: no step time
            {"step": 3, "time/step_s": 2.0, "mem/peak_cuda_bytes": 500, **state},
            {"step": 1, "time/step_s": 9.0, "mem/peak_cuda_bytes": 900, **state},  # the first step: not timed
            {"step": 2, "time/step_s": 1.0, "mem/peak_cuda_bytes": 700, **state, "mem/optim_bytes": 40},
            {"step": 4, "time/step_s": 4.0, "mem/peak_cuda_bytes": None, **state},
            '{"step": 5, "time/st']                                                 # cut short by a kill
    m = gpu_check.read_metrics(_write(tmp_path / "metrics.jsonl", rows))
    assert m.steps == 4
    assert m.step_s == 2.0                                  # median of steps 2, 3, 4: [1.0, 2.0, 4.0]
    assert m.peak_cuda_bytes == 900
    assert m.state_bytes == 150


def test_missing_keys_read_na(gpu_check, tmp_path):
    rows = [{"step": 1, "time/step_s": 3.0, "mem/params_bytes": 1, "mem/grads_bytes": 2}]   # no optim bytes
    m = gpu_check.read_metrics(_write(tmp_path / "metrics.jsonl", rows))
    assert (m.steps, m.step_s, m.peak_cuda_bytes, m.state_bytes) == (1, None, None, None)
    none = gpu_check.read_metrics(str(tmp_path / "absent.jsonl"))
    assert none.steps == 0
    spec = gpu_check.RunSpec("x", ["python"], str(tmp_path))
    row = gpu_check.result_row(gpu_check.RunResult(spec, 0, 1.5, m))
    assert row == ["x", "ok", "1.5", "n/a", "n/a", "n/a"]
    assert gpu_check.human_bytes(3 * 2 ** 30) == "3 GiB" and gpu_check.human_bytes(1536 * 2 ** 20) == "1.5 GiB"


def test_run_specs_cover_default_fsdp_and_vllm(gpu_check):
    specs = gpu_check.run_specs("/out", steps=4, gpus=1, has_vllm=False, python="py")
    by_name = {s.name: s for s in specs}
    assert list(by_name) == ["vlm_tiny default", "vlm_tiny fsdp_x1", "sd3_tiny default", "sd3_tiny fsdp_x1",
                             "vlm_tiny vllm", "vlm_tiny async_colocated"]
    default = by_name["vlm_tiny default"].argv
    assert default[:5] == ["py", "-m", "mmrl", "train", "configs/tiny/vlm_tiny.yaml"]
    for key in ("precision=bf16", "cpu=false", "max_steps=4", "eval.every=0", "output_dir=/out/vlm_tiny_default"):
        assert key in default
    fsdp = by_name["sd3_tiny fsdp_x1"].argv
    assert fsdp[:8] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "mmrl"]
    assert "distributed.strategy=fsdp" in fsdp and "precision=bf16" in fsdp
    assert "distributed.strategy=fsdp" not in default
    assert by_name["vlm_tiny vllm"].skip == "skipped: vllm not installed"
    assert by_name["vlm_tiny async_colocated"].skip == "skipped: ray not installed"
    assert all(s.skip is None for s in specs[:-2])


def test_run_specs_add_multi_gpu_fsdp_and_vllm_when_installed(gpu_check):
    specs = gpu_check.run_specs("/out", steps=6, gpus=4, has_vllm=True, python="py", has_ray=True)
    multi = {s.name: s.argv for s in specs if s.name.endswith("fsdp_x4")}
    assert set(multi) == {"vlm_tiny fsdp_x4", "sd3_tiny fsdp_x4"}
    for argv in multi.values():
        assert argv[argv.index("--nproc_per_node") + 1] == "4"
        assert "train.prompts_per_step=8" in argv and "max_steps=6" in argv
    vllm, colocated = specs[-2:]
    assert vllm.skip is None and "policy.backend=vllm" in vllm.argv
    assert colocated.skip is None and "asynchronous.gpus_per_learner=0.5" in colocated.argv


def test_each_config_the_check_runs_exists_and_takes_its_overrides(gpu_check, repo_root):
    from mmrl.config import load_config

    for spec in gpu_check.run_specs("/out", has_vllm=True, has_ray=True):
        i = spec.argv.index("train")
        cfg = load_config(os.path.join(repo_root, spec.argv[i + 1]), spec.argv[i + 2:])
        assert cfg.precision == "bf16" and cfg.cpu is False and cfg.eval.every == 0


def test_main_without_cuda_exits_2(gpu_check, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_headline_ratio_and_failures(gpu_check):
    def result(name, code, step_s):
        spec = gpu_check.RunSpec(name, [], "/out")
        return gpu_check.RunResult(spec, code, 1.0, gpu_check.RunMetrics(3, step_s, None, None))

    line = gpu_check.headline([result("vlm_tiny default", 0, 2.0), result("vlm_tiny fsdp_x1", 0, 3.0),
                               result("sd3_tiny default", 0, 1.0), result("sd3_tiny fsdp_x1", 2, None)])
    assert line.startswith("fsdp / default step time on 1 GPU, bf16: vlm_tiny 1.500, sd3_tiny n/a")
    assert "FAILED: sd3_tiny fsdp_x1" in line


def test_a_failed_run_keeps_its_stderr_tail_and_a_hung_run_is_killed(gpu_check, tmp_path):
    fail = gpu_check.RunSpec("fail", [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
                             str(tmp_path / "fail"))
    r = gpu_check.run_one(fail, timeout=60)
    assert r.returncode == 3 and r.stderr_tail == "boom" and gpu_check.status(r) == "exit 3"
    assert open(str(tmp_path / "fail") + ".stderr.log").read().strip() == "boom"
    hang = gpu_check.RunSpec("hang", [sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path / "hang"))
    r = gpu_check.run_one(hang, timeout=1)
    assert r.returncode == gpu_check.TIMEOUT_RC and gpu_check.status(r) == "timeout" and r.wall_s < 30
