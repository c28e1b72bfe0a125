"""Text-and-image environments for multi-turn VLM agents (after RAGEN, arXiv 2504.20073).

Built-ins: `bandit` (two named arms, one pull), `frozenlake` (a new map per seed), `sokoban` (a
room generated per seed by reverse play); `gym:<id>` wraps any installed gymnasium env with a
Discrete action space; 'module:attr' / 'path/to/file.py:attr' names your own. Build one with
`make_env(name, kwargs)`; validate a config without building with `check_env(name, kwargs)`.

The contract the multi-turn rollout relies on. An environment is a `gymnasium.Env` with:

- `reset(seed=int, options=None) -> (obs, info)`. The seed alone decides the episode (the map,
  room or arm order, and the env's own randomness such as slipping, which draws from
  `self.np_random` seeded by `super().reset(seed=seed)`): the same seed and the same actions give
  the same episode.
- `step(action: str) -> (obs, reward: float, terminated: bool, truncated: bool, info: dict)`, where
  `action` is the model's action text ("left"), read by `parse_action` (case-insensitive, outer
  whitespace and .,!?:;"'`* ignored, an action name or its decimal index).
- `obs = {"text": str, "image": PIL.Image.Image (RGB)}`; a text-only env may leave out "image".
- `info["success"]` (bool) on every step: whether the episode is solved.
  `info["action_is_valid"]` (bool) on every step: False when the action text names no action; then
  nothing changes, the reward is 0.0 (the caller substitutes its configured penalty),
  terminated and truncated are False and the same observation comes back.
- `instructions: str`: the task description shown once at the start: the rules, what the symbols
  mean, and the valid action names ("Actions: left, down, right, up.").
- `action_space = gymnasium.spaces.Text(...)`, an `observation_space` that is a `spaces.Dict` with a
  `text` Text space (the image described as the HxWx3 uint8 array it converts to, where fixed),
  `metadata = {"render_modes": ["rgb_array", "ansi"]}`, and `render()` returning the current image
  as an HxWx3 uint8 array ("rgb_array") or the text grid ("ansi").

Several roles (multi-agent episodes; `mmrl.roles`). An environment with a `roles: tuple[str, ...]`
attribute is played by several policies, one per role (the config's `env.roles` names which plays which):

- `reset(seed=...) -> (obs, info)` and `step(actions) -> (obs, reward, terminated, truncated, info)` where
  `obs` maps each role that acts next to its own observation ({"text", "image"}) and `actions` maps each
  role that was asked to act to its action text (None when its reply held no action). Roles in turn: one
  role in `obs`; at once: several.
- `reward` is a float (the team's: every role receives it) or a dict role -> float (each role's own;
  `env.role_credit` decides whether a role is credited with its own or the team's sum).
- `info["success"]` as above (the team's); `info["action_is_valid"]` a bool or a dict role -> bool.
- `instructions` a str (shared) or a dict role -> str.
Built-ins: `signal` (speaker then listener) and `matching` (two players at once), `envs/games.py`.

Grid text uses RAGEN's symbols, one row per line, one symbol per cell; grid images are 28 pixels
per cell (one Qwen2.5-VL image token per cell).
"""

from envs.actions import parse_action
from envs.registry import ENVIRONMENTS, check_env, make_env

__all__ = ["ENVIRONMENTS", "check_env", "make_env", "parse_action"]
