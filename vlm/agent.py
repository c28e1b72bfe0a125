"""The agent policy (`policy.name: vlm` with an `env:` section): G trajectories per environment seed, each a
multi-turn episode (`vlm.episodes.EpisodeRunner`); an action is a token of one of the model's replies, and a
trajectory is scored as the views the model saw at each turn (`vlm.trajectory`). The model, sampling,
reference and weights are those of the single-turn policy (`vlm.policy.VLMCommon`)."""

from __future__ import annotations

import os

import torch

from mmrl.types import PromptBatch, Rollout
from vlm.episodes import EpisodeRunner, samples_of
from vlm.generation import SamplingSpec
from vlm.policy import Config, VLMCommon, padded_versions
from vlm.setup import Parts
from vlm.trajectory import score_views


class AgentPolicy(VLMCommon):
    def __init__(self, cfg: Config, ctx, parts: Parts):
        from envs import make_env

        super().__init__(cfg, ctx, parts)
        toolbox = None
        if ctx.tools:
            from tools import ToolBox

            toolbox = ToolBox.from_config(list(ctx.tools), ctx.env.tool_format, ctx.env.max_tool_calls,
                                          log_dir=os.path.join(ctx.output_dir, "tools"))
        self.episodes = EpisodeRunner(ctx.env, cfg, parts, ctx.device, make_env, toolbox)

    def _episodes(self, prompts: PromptBatch, group_size: int, spec: SamplingSpec) -> list:
        with torch.no_grad(), self._autocast():
            return self.episodes.run(prompts.rows, prompts.seeds, group_size, spec)

    def _rollout(self, prompts: PromptBatch, group_size: int) -> Rollout:
        """G trajectories per environment seed; actions = the replies' tokens (vlm/trajectory.py)."""
        trajs = self._episodes(prompts, group_size, self._sampling())
        return self.rollout_of(trajs, prompts, group_size, f"step {prompts.step}")

    def rollout_of(self, trajs: list, prompts: PromptBatch, group_size: int, tag: str,
                   roles: list[str] | None = None) -> Rollout:
        """The Rollout of finished trajectories, groups of G consecutive ones (several per prompt in multi-role
        episodes, one per role: `roles` names each trajectory's, `vlm.roles.Team`)."""
        lengths = torch.tensor([t.actions_so_far for t in trajs], device=self.device)          # [N]
        t_max = max(1, int(lengths.max()))
        mask = (torch.arange(t_max, device=self.device)[None, :] < lengths[:, None]).float()   # [N, T]
        views = [t.views for t in trajs]
        versions = None                    # interruptible rollouts: the version of each reply token (vlm.episodes)
        if any(t.reply_versions for t in trajs):
            versions = padded_versions([torch.cat(t.reply_versions) if t.reply_versions
                                         else torch.zeros(0, dtype=torch.long) for t in trajs], t_max)   # [N, T]
        logp = None                        # deferred, or (interrupted) scored per version by the rollout worker
        if self.cfg.old_log_probs == "rollout" and versions is None:
            self.scorer.train(self.cfg.gradient_checkpointing)
            step = self.cfg.score_rows_per_call
            with torch.no_grad(), self._autocast():
                logp = torch.cat([score_views(self.scorer, views[lo:lo + step], t_max)[0]
                                  for lo in range(0, len(views), step)])                        # [N, T]
        return Rollout(samples=samples_of(trajs, prompts, group_size, tag, roles), log_probs=logp,
                       mask=mask, group=torch.arange(len(trajs) // group_size).repeat_interleave(group_size),
                       state={"views": views}, versions=versions)

    def _score_with(self, scorer, rollout: Rollout, index: torch.Tensor):
        views = [rollout.state["views"][i] for i in index.tolist()]
        return score_views(scorer, views, rollout.mask.shape[1])

    def _generate_eval(self, prompts: PromptBatch) -> list:
        """Greedy episodes, one per held-out environment seed."""
        return samples_of(self._episodes(prompts, 1, self._greedy()), prompts, 1, "eval")
