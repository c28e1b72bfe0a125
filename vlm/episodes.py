"""Multi-turn episodes of the VLM policy (the `env:` section): G trajectories per environment seed.

Each turn the model reads the system prompt, the task (the environment's instructions and first
observation), the kept history (its earlier replies and the observations and feedback that followed
them) and the current observation, and replies; the action is the content of `<answer>...</answer>`
when the format asks for that tag (`policy.format_prompt` r1 or one mentioning it), else the whole
reply. An action that does not parse (no tag, or the environment's `info["action_is_valid"]` is
False) gets `env.invalid_action_reward`, the environment is not stepped (or did not move), and the
episode goes on. An episode ends when the environment terminates or truncates it, after
`env.max_turns` replies, or when the next context would exceed `policy.max_prompt_tokens`.

Randomness: the G trajectories of a group reset their environments with the group's seed (same
first observation, same environment randomness for the same actions); reply j of the group at turn
t draws from a generator seeded from (the prompt seed, j, t) only, and one generate call holds the
live trajectories of one group only, so trajectories do not depend on the process split.
With the whole history kept, each trajectory keeps its KV cache across turns and a turn prefills only the tokens
the model has not read (`policy.cache_turns`, vlm/turn_cache.py); a turn's replies are still decoded together.
Interruptible rollouts (`asynchronous.interrupt`): each turn's generate call takes the newest weights at its start
(between turns) and at each token boundary (inside a reply, `vlm.generation`); `Trajectory.reply_versions` holds
each reply token's version.
Each observation image is encoded once, when it arrives, and reused by every later turn's
generation and by scoring (re-encoded with grad, once per view, when the vision side trains).

Tools (the top-level `tools:` list, `tools`): the first user message's system text announces them, and a
reply that calls one (in `env.tool_format`) is answered by the calls' results (text and images, `tools.box`)
instead of an environment step: the environment does not move, the reply's reward is 0, and its action is
None without counting as invalid. The results follow the reply as masked context rendered from the new
messages only, like an observation (vlm.turns.TurnTemplate.tool_turn). `env.max_turns` counts every reply,
tool calls included; `env.max_tool_calls` bounds the calls of an episode.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

import gymnasium

from mmrl.config import ConfigError
from mmrl.episodes import SEED_KEY, EpisodeMeta
from vlm.data import ROW_KEY, SOURCE_KEY
from vlm.generation import SamplingSpec, sample_seed
from vlm.prompts import format_text
from vlm.trajectory import join, make_view
from vlm.turns import TurnTemplate, as_image, reply_segment

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_action(reply: str, tagged: bool) -> str | None:
    """The action text of a reply: the last `<answer>` block's content when `tagged`, else the reply;
    None when there is none (an invalid action)."""
    if tagged:
        found = ANSWER.findall(reply)
        text = found[-1] if found else ""
    else:
        text = reply
    return text.strip() or None


def turn_seed(prompt_seed: int, j: int, turn: int) -> int:
    """Generator seed of reply `turn` of trajectory j of a group seeded `prompt_seed`: a hash of the three,
    so every (trajectory, turn) draws its own numbers. (torch's CPU generator keys on the seed's low 32 bits
    only: seeds that differ in high bits alone give the same stream.)"""
    digest = hashlib.blake2b(f"{sample_seed(prompt_seed, j)}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(eq=False)
class Trajectory:
    """One episode while it runs, and what it recorded."""

    env: gymnasium.Env
    seed: int
    obs: dict
    context: list                  # segments the next reply is generated from
    scored: set = field(default_factory=set)      # ids of reply segments an earlier view scores
    instructions: str = ""                        # the task text of the first user message
    system: str | None = None                     # the system prompt of its first user message (a role's, or the policy's)
    seen: list = field(default_factory=list)      # observation k as shown before reply k
    heads: dict = field(default_factory=dict)     # first user message of a window starting at observation k
    start: int = 0                                # the observation the current context's window starts at
    turns: list = field(default_factory=list)     # completed turns: [reply segment, following turn segment?]
    views: list = field(default_factory=list)     # scoring views (vlm.trajectory), closed ones
    actions_so_far: int = 0
    replies: list = field(default_factory=list)
    reply_tokens: list = field(default_factory=list)  # tokens of each reply (its action columns)
    reply_versions: list = field(default_factory=list)  # [l] weights version of each reply's tokens (interruptible)
    states: list = field(default_factory=list)        # a key of the observation each reply answered
    shown_features: list = field(default_factory=list)  # the encoder output observation k was first shown with
    tool_calls: list = field(default_factory=list)    # per reply: the `tools.CallRecord` dicts of its calls
    tool_names: tuple = ()                            # the run's tools (every episode lists them all, for metrics)
    results_seen: str = ""                            # the tool results since the last environment step (state keys)
    turn_cache: object = None                         # the KV cache of what the model read (vlm.turn_cache), or None
    actions: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    invalid: int = 0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    done: bool = False


class EpisodeRunner:
    """Runs the episodes of a `PromptBatch` whose rows are `{env_seed: s}` (see the module docstring)."""

    def __init__(self, env_cfg, cfg, parts, device, make_env, tools=None):
        self.env_cfg, self.cfg, self.p, self.device, self.make_env = env_cfg, cfg, parts, device, make_env
        self.tools = tools                     # a `tools.ToolBox`, or None
        tok = parts.model.tokenizer
        self.eos_text = tok.convert_ids_to_tokens(parts.tokens.stop_ids[0])
        self.template = TurnTemplate(parts.model.processor, parts.builder.keys, parts.builder.resize,
                                     parts.builder.image_kwargs, self.eos_text, parts.model.hf, device,
                                     keep_encoder_inputs=not cfg.freeze_vision)
        self.tagged = cfg.format_prompt == "r1" or "<answer>" in cfg.format_prompt
        if tools is not None:
            self.template.use_tools(tools.format, tools.schemas)

    # ------------------------------------------------------------------ text shown to the model
    def _shown(self, obs: dict, lead: str) -> tuple[str, object]:
        """(text, image or None) of an observation under env.observation, after `lead` (instructions or feedback)."""
        mode = self.env_cfg.observation
        parts = [lead] if lead else []
        if mode in ("text", "both") and obs.get("text"):
            parts.append(str(obs["text"]))
        image = obs.get("image") if mode in ("image", "both") else None
        if mode == "image" and image is None:
            raise ValueError("env.observation=image but the environment's observation has no 'image'")
        return format_text("\n".join(parts), self.cfg.format_prompt), image

    def _feedback(self, action: str | None, valid: bool, reward: float) -> str:
        if action is None or not valid:
            return f"Your reply had no valid action. Reward: {reward:g}."
        return f"You chose {action}. Reward: {reward:g}."

    # ------------------------------------------------------------------ one group
    def start(self, row: dict, group_size: int) -> list[Trajectory]:
        """Reset a group's G environments with the row's seed and build their shared first prompt."""
        seed, name = int(row[SEED_KEY]), self.env_cfg.name
        envs = [self.make_env(name, dict(self.env_cfg.kwargs)) for _ in range(group_size)]
        resets = [env.reset(seed=seed) for env in envs]
        first = resets[0][0]
        if any(_obs_key(o) != _obs_key(first) for o, _ in resets[1:]):
            raise ValueError(f"environment {name!r}: reset(seed={seed}) gave different observations for the same seed; "
                             "an environment must draw its randomness from reset's seed (super().reset(seed=seed))")
        instructions = self.env_cfg.instructions
        if instructions is None:
            instructions = str(getattr(envs[0], "instructions", getattr(envs[0].unwrapped, "instructions", "")) or "")
        text, image = self._shown(first, instructions)
        head = self.template.head(self.cfg.system_prompt, text, image)            # encoded once for the group
        if head.input_ids.numel() > self.cfg.max_prompt_tokens:
            raise ConfigError(f"environment seed {seed}: the first prompt has {head.input_ids.numel()} tokens "
                              f"(> policy.max_prompt_tokens={self.cfg.max_prompt_tokens}); raise it or lower policy.max_pixels")
        return [Trajectory(env, seed, obs, [head], instructions=instructions, seen=[obs], heads={0: head},
                           shown_features=[head.features], tool_names=tuple(self.tools.names) if self.tools else (),
                           system=self.cfg.system_prompt)
                for env, (obs, _) in zip(envs, resets)]

    def _step(self, t: Trajectory, tokens, ended: bool, turn: int) -> None:
        """Record reply `turn` of `t`, step its environment (or answer its tool calls) and build what the model
        sees next."""
        reply = self.p.model.tokenizer.decode(tokens, skip_special_tokens=True)
        t.states.append(state_key(t.obs, t.results_seen))      # after tool results: the observation and those
        if self.tools is not None and self.tools.has_calls(reply):
            self._tool_step(t, reply, tokens, ended, turn)
            return
        t.tool_calls.append([])
        t.results_seen = ""
        action = extract_action(reply, self.tagged)
        valid, reward = action is not None, self.env_cfg.invalid_action_reward
        if valid:
            obs, r, term, trunc, info = t.env.step(action)
            valid = bool(info.get("action_is_valid", True))
            reward = float(r) if valid else self.env_cfg.invalid_action_reward
            t.obs, t.success = obs, bool(info.get("success", False))
            t.terminated, t.truncated = bool(term), bool(trunc)
        t.invalid += not valid
        seg = self._reply(t, reply, tokens, action if valid else None, reward, turn)
        if t.done:
            return
        text, image = self._shown(t.obs, self._feedback(action, valid, reward))
        nxt = self.template.turn(text, image, ended)
        self._follow(t, seg, nxt, nxt.features if image is not None else None)

    @staticmethod
    def append_reply(t: Trajectory, reply: str, tokens, action, reward: float):
        """Record a reply, its action and reward (its tokens the next action columns); returns its segment."""
        t.replies.append(reply)
        t.reply_tokens.append(int(tokens.numel()))
        t.actions.append(action)
        t.rewards.append(reward)
        seg = reply_segment(tokens)
        t.context.append(seg)
        t.actions_so_far += int(tokens.numel())
        return seg

    def call_tools(self, t: Trajectory, reply: str) -> list:
        """Answer a reply's tool calls (every failure shown to the model, `tools.box`; the episode's earlier calls
        count against the limit) and record them; returns the results to show."""
        used = sum(len(calls) for calls in t.tool_calls)
        records, results = self.tools.run(reply, t.obs, used)
        t.tool_calls.append([r.as_dict() for r in records])
        t.results_seen += json.dumps(t.tool_calls[-1], sort_keys=True, default=str)
        return results

    def _reply(self, t: Trajectory, reply: str, tokens, action, reward: float, turn: int):
        """Record a reply (its tokens the next action columns) and whether the episode ends with it."""
        seg = self.append_reply(t, reply, tokens, action, reward)
        t.done = t.terminated or t.truncated or turn + 1 >= self.env_cfg.max_turns
        t.truncated = t.truncated or (t.done and not t.terminated)
        if t.done:
            t.turns.append([seg])
        return seg

    def _follow(self, t: Trajectory, seg, nxt, features) -> None:
        """The reply `seg` is followed by the context segment `nxt`, which shows observation `t.obs` (its image's
        encoder output `features`; None: the image was shown before, or there is none)."""
        t.turns.append([seg, nxt])
        t.context.append(nxt)
        t.seen.append(t.obs)
        t.shown_features.append(features if features is not None else t.shown_features[-1])

    def _tool_step(self, t: Trajectory, reply: str, tokens, ended: bool, turn: int) -> None:
        """A reply that calls tools: answer the calls (every failure shown to the model, `tools.box`); the
        environment does not move."""
        results = self.call_tools(t, reply)
        seg = self._reply(t, reply, tokens, None, 0.0, turn)
        if not t.done:
            self._follow(t, seg, self.template.tool_turn(results, ended), None)

    def _head(self, t: Trajectory, s: int):
        """The first user message of a window starting at observation s: the instructions and observation s
        (its image features reused from the turn that first showed it)."""
        if s not in t.heads:
            text, image = self._shown(t.seen[s], t.instructions)
            features = t.shown_features[s] if image is not None else None  # encoded when first shown
            t.heads[s] = self.template.head(t.system, text, image, features=features)
        return t.heads[s]

    def _window(self, t: Trajectory) -> None:
        """Keep the last env.history_turns turns (None = all): the next context is the instructions with the
        window's first observation, then each kept reply and what followed it; when the window moves, close
        the current view and start a new one."""
        k, n = self.env_cfg.history_turns, len(t.turns)
        if k is None or max(0, n - k) == t.start:
            return
        self._close_view(t)
        t.start = max(0, n - k)
        t.context = [self._head(t, t.start)] + [s for pair in t.turns[t.start:n] for s in pair]

    def _close_view(self, t: Trajectory) -> None:
        """Turn the context up to its last reply into a view whose actions are the replies no earlier view
        scored (earlier replies kept by the history window are context here)."""
        last = max(i for i, s in enumerate(t.context) if s.action)
        segments = t.context[:last + 1]
        new = {id(s) for s in segments if s.action and id(s) not in t.scored}
        column = sum(int(v.positions.numel()) for v in t.views)
        t.views.append(make_view(segments, {SOURCE_KEY: "env seed", ROW_KEY: t.seed}, column, new))
        t.scored |= new

    def live_contexts(self, group: list[Trajectory]) -> list[tuple[int, object]]:
        """(j, context PromptInputs) of the trajectories of a group that go on to another turn; one whose
        context no longer fits policy.max_prompt_tokens ends here, truncated."""
        out = []
        for j, t in enumerate(group):
            if t.done:
                continue
            x = join(t.context, {SOURCE_KEY: "env seed", ROW_KEY: t.seed})[0]
            if x.input_ids.numel() > self.cfg.max_prompt_tokens:
                t.done = t.truncated = True
                continue
            out.append((j, x))
        return out

    def record(self, t: Trajectory, tokens, ended: bool, turn: int) -> None:
        """Reply `turn` of `t` (its tokens, and whether they end with a stop token): step the environment,
        build the next context."""
        self._step(t, tokens, ended, turn)
        if not t.done:
            self._window(t)

    def finish(self, group: list[Trajectory]) -> None:
        """Close each trajectory's last view and its environment."""
        for t in group:
            if t.replies:
                self._close_view(t)
            t.env.close()

    def _caches_turns(self) -> bool:
        """Keep each trajectory's KV cache across turns (vlm.turn_cache): policy.cache_turns, the whole history kept
        (each context extends the last), and a backend that can."""
        backend = self.p.backend
        return (self.cfg.cache_turns and self.env_cfg.history_turns is None and hasattr(backend, "sample_turns")
                and backend.caches_turns())

    def run(self, rows: list[dict], seeds: list[int], group_size: int, spec: SamplingSpec) -> list[Trajectory]:
        """Every row's G trajectories, row-major (trajectory j of row p at p * G + j)."""
        out = []
        for row, seed in zip(rows, seeds):
            group = self.start(row, group_size)
            for turn in range(self.env_cfg.max_turns):
                live = self.live_contexts(group)
                if not live:
                    break
                row_seeds = None if spec.greedy else [turn_seed(seed, j, turn) for j, _ in live]
                if self._caches_turns():
                    outs, states = self.p.backend.sample_turns([x for _, x in live], spec, row_seeds, self.device,
                                                               [group[j].turn_cache for j, _ in live])
                    for (j, _), state in zip(live, states):
                        group[j].turn_cache = state
                else:
                    outs = self.p.backend.sample_rows([x for _, x in live], spec, row_seeds, self.device)
                versions = getattr(self.p.backend, "last_versions", None)     # interruptible rollouts: per token
                for i, ((j, _), (tokens, ended)) in enumerate(zip(live, outs)):
                    if versions is not None:
                        group[j].reply_versions.append(versions[i])
                    self.record(group[j], tokens, ended, turn)
            self.finish(group)
            for t in group:
                t.turn_cache = None                    # the caches live for one rollout's episodes
            out += group
        return out


def _obs_key(obs: dict) -> tuple:
    image = obs.get("image")
    data = image.tobytes() if hasattr(image, "tobytes") else None
    return str(obs.get("text")), data


def state_key(obs: dict, results: str = "") -> str:
    """A short key of an observation (its text and image pixels) and of the tool `results` the model read since
    the environment last moved: equal observations and results, equal keys (GiGPO's anchor states, arXiv
    2505.10978); a reply after a tool's result is not in the state of the reply that called it."""
    text, data = _obs_key(obs)
    extra = b"\0" + results.encode() if results else b""
    return hashlib.sha1(text.encode() + b"\0" + (data or b"") + extra).hexdigest()[:16]


def trajectory_meta(t: Trajectory, seed: int) -> dict:
    """The `Sample.meta` of a finished trajectory (mmrl.episodes.EpisodeMeta)."""
    return {EpisodeMeta.SEED: seed, EpisodeMeta.RETURN: float(sum(t.rewards)), EpisodeMeta.TURN_REWARDS: list(t.rewards),
            EpisodeMeta.ACTIONS: list(t.actions), EpisodeMeta.REPLIES: list(t.replies), EpisodeMeta.TURNS: len(t.replies),
            EpisodeMeta.SUCCESS: t.success, EpisodeMeta.INVALID: t.invalid, EpisodeMeta.TERMINATED: t.terminated,
            EpisodeMeta.TRUNCATED: t.truncated, EpisodeMeta.TURN_TOKENS: list(t.reply_tokens),
            EpisodeMeta.STATES: list(t.states), "num_tokens": t.actions_so_far,
            EpisodeMeta.TOOL_CALLS: [list(calls) for calls in t.tool_calls], EpisodeMeta.TOOLS: list(t.tool_names),
            EpisodeMeta.FINAL_IMAGE: as_image(t.obs["image"]) if t.obs.get("image") is not None else None}




def samples_of(trajs: list[Trajectory], prompts, group_size: int, tag: str, roles: list[str] | None = None) -> list:
    """One reward `Sample` per trajectory: prompt = the task text, output = the replies, one per line,
    images = the observations shown, meta = `trajectory_meta`. `roles`: the role each trajectory played
    (multi-role episodes, `vlm.roles`: `meta["role"]`; each prompt then holds one group per role)."""
    from rewards.sample import Sample

    out = []
    groups_per_prompt = len(trajs) // (group_size * len(prompts.index)) if roles else 1   # one per role
    for i, t in enumerate(trajs):
        p, j = divmod(i, group_size * groups_per_prompt)
        j %= group_size
        # the first head (the context's head is the current window's), then each following turn
        shown = [t.heads[0]] + [s for pair in t.turns for s in pair[1:]]
        images = [im for s in shown for im in s.images]
        first = t.views[0].inputs if t.views else None
        meta, role = trajectory_meta(t, t.seed), ""
        if roles:
            meta[EpisodeMeta.ROLE] = roles[i]
            role = f" role {roles[i]}"
        out.append(Sample(prompt=first.text if first else "", output="\n".join(t.replies),
                          images=images, answer=None, meta=meta,
                          id=f"{tag} env seed {t.seed} (prompt {prompts.index[p]}){role} trajectory {j}"))
    return out
