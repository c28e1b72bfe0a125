"""The in-process parts of FSDP2 sharding (mmrl/distributed/sharding.py, mmrl/distributed/memory.py, mmrl/state/dcp.py, the VLM scorer's
shared layout, the distributed config section); the multi-process runs are in test_fsdp.py."""

import pytest
import torch

from mmrl.state import dcp
from mmrl.distributed import memory, sharding
from mmrl.config import ConfigError, load_config


def test_distributed_section_is_checked_at_load(tmp_path, bandit_config):
    with pytest.raises(ConfigError, match=r"distributed.strategy.*ddp, fsdp"):
        load_config(bandit_config, [f"output_dir={tmp_path}", "distributed.strategy=zero3"])
    with pytest.raises(ConfigError, match=r"distributed.rollout.*gathered, sharded"):
        load_config(bandit_config, [f"output_dir={tmp_path}", "distributed.rollout=lazy"])
    cfg = load_config(bandit_config, [f"output_dir={tmp_path}"])
    assert (cfg.distributed.strategy, cfg.distributed.rollout, cfg.distributed.reshard_after_forward) == \
        ("ddp", "gathered", True)


def test_per_block_gathers_refuse_episodes(tmp_path, bandit_config):
    agent = bandit_config.replace("bandit.yaml", "agent_tiny.yaml")
    with pytest.raises(ConfigError, match="distributed.rollout.*episodes"):
        load_config(agent, [f"output_dir={tmp_path}", "distributed.strategy=fsdp", "distributed.rollout=sharded"])
    load_config(agent, [f"output_dir={tmp_path}", "distributed.strategy=fsdp"])   # gathered: fine


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()


class Inner(torch.nn.Module):
    pass


class Net(torch.nn.Module):
    _no_split_modules = ["Block", "Inner"]

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = Inner()


def test_the_units_are_the_outermost_declared_blocks():
    net = Net()
    assert sharding.block_classes(net) == {"Block", "Inner"}
    assert [n for n, _ in sharding.blocks(net, {"Block", "Inner"})] == ["blocks.0", "blocks.1", "head"]
    assert [n for n, _ in sharding.blocks(net, {"Inner"})] == ["blocks.0.inner", "blocks.1.inner", "head"]


def test_real_models_declare_their_blocks():
    from diffusers import SD3Transformer2DModel

    from diffusion.tiny import resolve
    from vlm.model import load_model
    from vlm.policy import Config

    hf = load_model(Config(model="tiny:qwen2_5_vl"), "cpu", torch.float32)
    found = sharding.blocks(hf, sharding.block_classes(hf))
    assert {type(m).__name__ for _, m in found} == {"Qwen2_5_VLDecoderLayer", "Qwen2_5_VLVisionBlock"}
    assert len(found) == hf.config.text_config.num_hidden_layers + hf.config.vision_config.depth
    den = SD3Transformer2DModel.from_pretrained(resolve("tiny:sd3"), subfolder="transformer")
    found = sharding.blocks(den, sharding.block_classes(den))
    assert [type(m).__name__ for _, m in found] == ["JointTransformerBlock"] * den.config.num_layers


def test_gathered_and_local_pass_unsharded_modules_through():
    lin = torch.nn.Linear(3, 2)
    with sharding.gathered(lin, None):
        assert not sharding.is_sharded(lin)
    t = torch.ones(2)
    assert sharding.local(t) is t and sharding.full(t) is t


def test_memory_counts_bytes_of_the_tensors():
    assert memory.tensor_bytes([torch.zeros(3, 4), None, torch.zeros(5, dtype=torch.bfloat16)]) == 48 + 10
    lin = torch.nn.Linear(4, 2)                                          # 8 + 2 fp32 parameters
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(1, 4)).sum().backward()
    assert memory.grads_bytes(lin.parameters()) == 40
    opt.step()
    assert memory.optim_bytes(opt) == 2 * 40 + 2 * 4                    # exp_avg, exp_avg_sq, a float32 step each
    row = memory.metrics(lin, opt)
    assert row["mem/params_bytes"].value == 40 and row["mem/params_bytes"].reduce == "max"
    assert row["mem/peak_rss_bytes"].value > 10 * 2**20


def test_one_layout_per_call_only_under_sharding(monkeypatch):
    from vlm.batch import Layout
    from vlm.logprobs import one_layout_if_sharded

    layouts = [Layout(3, 5), Layout(4, 5), Layout(2, 6)]
    assert one_layout_if_sharded(torch.nn.Linear(1, 1), layouts) == layouts
    monkeypatch.setattr(sharding, "is_sharded", lambda m: True)
    assert one_layout_if_sharded(torch.nn.Linear(1, 1), layouts) == [Layout(4, 8)] * 3   # prompt 4, completion 4


def test_sharded_state_round_trips_in_one_process(tmp_path, bandit_cfg):
    """The DCP form of a run's state (weights, AdamW, EMA) written and read back without a process group."""
    from mmrl.loop.trainer import setup

    def run(name):
        return setup(bandit_cfg(tmp_path / name, "train.ema_decay=0.9"))

    a = run("a")
    a.policy.net.theta.data.normal_()
    loss = a.policy.net.theta.square().sum()
    loss.backward()
    a.optimizer.step()
    a.ema.update()
    dcp.save(str(tmp_path / "state"), a.policy, a.optimizer, a.ema)
    b = run("b")
    dcp.load(str(tmp_path / "state"), b.policy, b.optimizer, b.ema)
    assert torch.equal(a.policy.net.theta, b.policy.net.theta)
    assert torch.equal(a.ema.shadow[0], b.ema.shadow[0]) and b.ema.steps == a.ema.steps == 1
    sa, sb = a.optimizer.optimizer.state, b.optimizer.optimizer.state
    (pa,), (pb,) = sa.values(), sb.values()
    assert torch.equal(pa["exp_avg_sq"], pb["exp_avg_sq"])
    c = run("c")
    dcp.load_weights(str(tmp_path / "state"), c.policy, ema=True)        # `mmrl export --ema`
    assert torch.equal(c.policy.net.theta, a.ema.shadow[0])
    assert dcp.has_ema(str(tmp_path / "state"))


def test_a_failed_sharded_write_is_a_checkpoint_error_and_leaves_nothing(tmp_path, monkeypatch):
    from mmrl.state import checkpoint

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    with pytest.raises(checkpoint.CheckpointError, match=r"step_000003.*No space left.*no earlier checkpoint"):
        checkpoint.save_sharded(str(tmp_path), 3, None, None, None, {}, 2)
    assert list(tmp_path.iterdir()) == []


def test_accelerates_own_fsdp_launch_is_refused_with_the_way_to_launch(tmp_path, monkeypatch, bandit_cfg):
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    import mmrl.loop.trainer as trainer

    class FSDPLaunched(Accelerator):
        @property
        def distributed_type(self):
            return DistributedType.FSDP

    monkeypatch.setattr(trainer, "Accelerator", FSDPLaunched)
    with pytest.raises(ConfigError, match="without --use_fsdp.*distributed.strategy=fsdp"):
        trainer.setup(bandit_cfg(tmp_path))
