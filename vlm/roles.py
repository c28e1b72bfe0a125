"""Multi-role episodes (multi-agent; `mmrl.roles`): G joint episodes per environment seed, each role played by
its policy, and each role's trajectory a training sample of that policy.

A joint episode resets one environment with the group's seed. Each turn the roles in the observation act:
for each role (in the environment's order) the live episodes of the group where it acts reply in one generate
call of the role's policy; the environment then steps once with every acting role's action text (None for a
reply without an action: counted invalid, the role credited `env.invalid_action_reward` besides the step's
reward). What each role is credited with (`env.role_credit`, `mmrl.roles.credited`) goes to its latest reply.

A role's trajectory is what that role saw and said: its system prompt (the role's `system_prompt`, else its
policy's), the environment's instructions for it and its first observation, then each of its replies followed by
its feedback and next observation when it acts again. The other roles' replies reach it only through what the
environment shows it (the listener reads the speaker's message in its observation). The trajectory is scored as
a single-role episode's is (`vlm.trajectory` views; its history window `env.history_turns`), so a role's log-probs
at training time are exactly those its policy sampled with (ratio 1).

Tools (`tools:`): every policy calls the run's tools in its own template's format. A role's reply that calls them
is answered with their results and the role replies again in the same turn (the environment waits for its
action), up to `env.max_tool_calls` times per turn; the calls of the whole episode count against that limit
as in a one-role episode, and a reply after the last allowed round is the role's action whatever it holds.

Randomness: reply j of the group's role r at turn t draws from `turn_seed(prompt seed, j, t * R + r)` (R roles;
its c-th reply of the turn after tool results from `turn_seed(prompt seed, j, (c * T + t) * R + r)`, T turns),
and one generate call holds one role's replies of one group: trajectories do not depend on the process split or
on the other groups. Every role must act at least once in every episode (a role that never acts has nothing to
train); the environment's reset must give the same observations for the same seed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from mmrl.config import ConfigError
from mmrl.episodes import SEED_KEY
from mmrl.roles import credited, policies_of
from mmrl.types import PromptBatch
from vlm.episodes import Trajectory, _obs_key, extract_action, samples_of, state_key, turn_seed


@dataclass(eq=False)
class Joint:
    """One joint episode while it runs: the environment, the roles acting next and their observations, and each
    role's trajectory (created when the role first acts)."""

    env: object
    seed: int
    obs: dict                                        # role -> observation, for the roles acting next
    trajs: dict = field(default_factory=dict)        # role -> Trajectory
    pending: dict = field(default_factory=dict)      # role -> (its last reply segment, ended) awaiting what follows
    owed: dict = field(default_factory=dict)         # role -> credit it got before its first reply
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    done: bool = False


def _valid(info: dict, role: str) -> bool:
    flag = info.get("action_is_valid", True)
    return bool(flag.get(role, True) if isinstance(flag, dict) else flag)


class RoleRunner:
    """Runs the joint episodes of a `PromptBatch` whose rows are `{env_seed: s}` (module docstring).

    env_cfg:  the `env:` section; roles: role -> `mmrl.roles.RoleConfig`; runners: policy name -> that policy's
    `vlm.episodes.EpisodeRunner` (its template, parser and backend); make_env: `envs.make_env`."""

    def __init__(self, env_cfg, roles: dict, runners: dict, make_env, device):
        self.env_cfg, self.roles, self.runners, self.make_env, self.device = env_cfg, roles, runners, make_env, device
        self.order = list(roles)

    def _runner(self, role: str):
        return self.runners[self.roles[role].policy]

    def _instructions(self, env, role: str) -> str:
        if self.env_cfg.instructions is not None:
            return self.env_cfg.instructions
        found = getattr(env, "instructions", getattr(env.unwrapped, "instructions", ""))
        return str((found.get(role, "") if isinstance(found, dict) else found) or "")

    def _check_obs(self, obs, where: str) -> dict:
        if not isinstance(obs, dict) or not set(obs) <= set(self.order) or any(not isinstance(o, dict)
                                                                            for o in obs.values()):
            raise ValueError(f"environment {self.env_cfg.name!r} {where} returned {obs!r}; a multi-role environment's "
                             f"observation maps each acting role (of {self.order}) to its {{'text', 'image'}}")
        return obs

    def start(self, seed: int, group_size: int) -> list[Joint]:
        envs = [self.make_env(self.env_cfg.name, dict(self.env_cfg.kwargs)) for _ in range(group_size)]
        resets = [env.reset(seed=seed) for env in envs]
        first = self._check_obs(resets[0][0], f"reset(seed={seed})")
        key = {r: _obs_key(o) for r, o in first.items()}
        if any({r: _obs_key(o) for r, o in obs.items()} != key for obs, _ in resets[1:]):
            raise ValueError(f"environment {self.env_cfg.name!r}: reset(seed={seed}) gave different observations for "
                             "the same seed; an environment must draw its randomness from reset's seed")
        group = [Joint(env, seed, obs) for env, (obs, _) in zip(envs, resets)]
        for e in group:
            self._show(e, {r: "" for r in e.obs})
        return group

    # ------------------------------------------------------------------ what a role sees
    def _show(self, e: Joint, leads: dict) -> None:
        """Each role in `e.obs` gets its observation: the first user message of its trajectory, or (after its
        last reply) its feedback `leads[role]` and the observation as the next turn."""
        for role, obs in e.obs.items():
            runner, t = self._runner(role), e.trajs.get(role)
            if t is None:
                instructions = self._instructions(e.env, role)
                text, image = runner._shown(obs, instructions)
                system = self.roles[role].system_prompt            # the role's, else its policy's
                system = runner.cfg.system_prompt if system is None else system
                head = runner.template.head(system, text, image)
                if head.input_ids.numel() > runner.cfg.max_prompt_tokens:
                    raise ConfigError(f"environment seed {e.seed}, role {role!r}: the first prompt has "
                                      f"{head.input_ids.numel()} tokens (> max_prompt_tokens="
                                      f"{runner.cfg.max_prompt_tokens} of its policy); raise it")
                e.trajs[role] = Trajectory(e.env, e.seed, obs, [head], instructions=instructions, seen=[obs],
                                           heads={0: head}, shown_features=[head.features], system=system,
                                           tool_names=tuple(runner.tools.names) if runner.tools else ())
                continue
            seg, ended = e.pending.pop(role)
            t.obs = obs
            text, image = runner._shown(obs, leads.get(role, ""))
            nxt = runner.template.turn(text, image, ended)
            runner._follow(t, seg, nxt, nxt.features if image is not None else None)
            runner._window(t)

    # ------------------------------------------------------------------ one turn of a group
    def _act(self, group: list[Joint], role: str, r: int, turn: int, spec, prompt_seed: int) -> dict:
        """The replies of `role` in the group's live episodes where it acts: {j: action text or None}. With tools,
        a reply that calls them gets their results and the role replies again in the same turn (the environment
        waits), up to env.max_tool_calls times; the reply after that is its action whatever it holds."""
        runner = self._runner(role)
        calls = runner.tools.max_calls if runner.tools is not None else 0
        waiting = [j for j, e in enumerate(group) if not e.done and role in e.obs]
        actions = {}
        for c in range(calls + 1):
            live = []                               # (j, context); a context past max_prompt_tokens ends its episode
            for j in waiting:
                live += [(j, x) for _, x in runner.live_contexts([group[j].trajs[role]])]
            if not live:
                break
            # the c-th reply of a turn: its own seeds (c = 0: the seeds of a run without tools)
            at = (c * self.env_cfg.max_turns + turn) * len(self.order) + r
            seeds = None if spec.greedy else [turn_seed(prompt_seed, j, at) for j, _ in live]
            outs = runner.p.backend.sample_rows([x for _, x in live], spec, seeds, self.device)
            waiting = []
            for (j, _), (tokens, ended) in zip(live, outs):
                e, t = group[j], group[j].trajs[role]
                reply = runner.p.model.tokenizer.decode(tokens, skip_special_tokens=True)
                t.states.append(state_key(t.obs, t.results_seen))
                seg = runner.append_reply(t, reply, tokens, None, e.owed.pop(role, 0.0))   # its action: below
                if c < calls and runner.tools.has_calls(reply):          # the results follow as a tool turn
                    runner._follow(t, seg, runner.template.tool_turn(runner.call_tools(t, reply), ended), None)
                    runner._window(t)
                    waiting.append(j)
                    continue
                t.tool_calls.append([])
                t.results_seen = ""
                t.actions[-1] = extract_action(reply, runner.tagged)
                e.pending[role] = (seg, ended)
                actions[j] = t.actions[-1]
        return actions

    def _step(self, e: Joint, actions: dict, turn: int) -> None:
        """Step the environment with the acting roles' actions; credit every role; show the next observations."""
        obs, reward, term, trunc, info = e.env.step(actions)
        leads = {}
        for role in self.order:
            got = credited(reward, role, self.env_cfg.role_credit)
            t = e.trajs.get(role)
            if role in actions:
                valid = actions[role] is not None and _valid(info, role)
                if not valid:
                    got += self.env_cfg.invalid_action_reward
                    t.invalid += 1
                    t.actions[-1] = None
                leads[role] = self._runner(role)._feedback(actions[role], valid, got)
            if t is not None and t.replies:
                t.rewards[-1] += got
            else:
                e.owed[role] = e.owed.get(role, 0.0) + got
        e.success, e.terminated, e.truncated = bool(info.get("success", False)), bool(term), bool(trunc)
        e.done = e.terminated or e.truncated or turn + 1 >= self.env_cfg.max_turns
        e.truncated = e.truncated or (e.done and not e.terminated)
        if not e.done:
            e.obs = self._check_obs(obs, "step")
            if not e.obs:
                raise ValueError(f"environment {self.env_cfg.name!r}: step returned no acting role while the episode "
                                 "goes on; an observation names the roles that act next")
            self._show(e, leads)

    def _finish(self, e: Joint) -> None:
        for role in self.order:
            t = e.trajs.get(role)
            if t is None or not t.replies:
                raise ValueError(f"environment {self.env_cfg.name!r}, seed {e.seed}: role {role!r} never acted in an "
                                 f"episode of {len(next(iter(e.trajs.values())).replies) if e.trajs else 0} turns "
                                 f"(env.max_turns={self.env_cfg.max_turns}); every role must act at least once")
            if role in e.pending:
                seg, _ = e.pending.pop(role)
                t.turns.append([seg])
            t.success, t.terminated, t.truncated, t.done = e.success, e.terminated, e.truncated, True
            self._runner(role)._close_view(t)
        e.env.close()

    def run(self, rows: list[dict], seeds: list[int], group_size: int, specs: dict) -> dict:
        """Role -> its trajectories, row-major (trajectory j of row p at p * G + j); `specs`: policy name ->
        SamplingSpec."""
        out = {role: [] for role in self.order}
        for row, seed in zip(rows, seeds):
            group = self.start(int(row[SEED_KEY]), group_size)
            for turn in range(self.env_cfg.max_turns):
                if all(e.done for e in group):
                    break
                acted = [{} for _ in group]
                for r, role in enumerate(self.order):
                    for j, action in self._act(group, role, r, turn, specs[self.roles[role].policy], seed).items():
                        acted[j][role] = action
                for j, e in enumerate(group):
                    if not e.done:
                        if set(acted[j]) != set(e.obs):
                            e.done = e.truncated = True            # a role's context no longer fits
                            continue
                        self._step(e, acted[j], turn)
            for e in group:
                self._finish(e)
                for role in self.order:
                    out[role].append(e.trajs[role])
        return out


class Team:
    """The run's policies playing a multi-role environment (`build_team`): `rollout` -> each policy's `Rollout`
    (its roles' trajectories, groups of G per (prompt, role)), `generate_eval` -> every role's greedy sample.

    policies: name -> `vlm.agent.AgentPolicy`; roles: role -> RoleConfig; env_cfg: the `env:` section."""

    def __init__(self, policies: dict, roles: dict, env_cfg, device):
        from envs import make_env

        self.policies, self.roles, self.env_cfg = policies, roles, env_cfg
        self.names = policies_of(roles)
        self.runner = RoleRunner(env_cfg, roles, {n: p.episodes for n, p in policies.items()}, make_env, device)

    def roles_of(self, name: str) -> list[str]:
        return [r for r in self.runner.order if self.roles[r].policy == name]

    @contextlib.contextmanager
    def _sampling(self, step: int):
        with contextlib.ExitStack() as stack:
            for p in self.policies.values():
                p._before_sampling(step)
                stack.enter_context(p._gathered())
                stack.enter_context(p._autocast())
            stack.enter_context(torch.no_grad())
            yield

    def _episodes(self, prompts: PromptBatch, group_size: int, greedy: bool) -> dict:
        specs = {n: (p._greedy() if greedy else p._sampling()) for n, p in self.policies.items()}
        with self._sampling(prompts.step):
            return self.runner.run(prompts.rows, prompts.seeds, group_size, specs)

    def _per_policy(self, by_role: dict, n_prompts: int, group_size: int) -> dict:
        """Policy name -> its trajectories, prompt-major then role then trajectory: groups of G per (prompt, role)."""
        out = {}
        for name in self.names:
            roles = self.roles_of(name)
            out[name] = [(role, t) for p in range(n_prompts) for role in roles
                         for t in by_role[role][p * group_size:(p + 1) * group_size]]
        return out

    def rollout(self, prompts: PromptBatch, group_size: int) -> dict:
        """Policy name -> its Rollout of this batch's joint episodes."""
        by_policy = self._per_policy(self._episodes(prompts, group_size, False), len(prompts), group_size)
        out = {}
        for name, pairs in by_policy.items():
            policy = self.policies[name]
            with policy._gathered():
                out[name] = policy.rollout_of([t for _, t in pairs], prompts, group_size, f"step {prompts.step}",
                                              roles=[r for r, _ in pairs])
        return out

    def generate_eval(self, prompts: PromptBatch) -> list:
        """Every role's greedy trajectory of each held-out seed, prompt-major then in the environment's role order."""
        by_role = self._episodes(prompts, 1, True)
        out = []
        for p in range(len(prompts)):
            for role in self.runner.order:
                t = by_role[role][p]
                out += samples_of([t], _one(prompts, p), 1, "eval", roles=[role])
        return out


def _one(prompts: PromptBatch, p: int) -> PromptBatch:
    return PromptBatch(rows=[prompts.rows[p]], index=[prompts.index[p]], seeds=[prompts.seeds[p]], step=prompts.step)

