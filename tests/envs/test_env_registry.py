"""make_env / check_env: names, gym ids, user references, and errors that name the config key."""

import ast
import os
import textwrap

import gymnasium as gym
import pytest

from envs import ENVIRONMENTS, check_env, make_env
from envs.bandit import Bandit
from envs.frozenlake import FrozenLake
from envs.sokoban import Sokoban

USER_ENV = '''
import gymnasium as gym
from envs.actions import action_text_space, invalid_step, parse_action


class Coin(gym.Env):
    """Say the side the coin shows."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, sides: int = 2):
        if sides < 2:
            raise ValueError("sides must be at least 2")
        self.names = [str(i) for i in range(sides)]
        self.instructions = "Actions: " + ", ".join(self.names) + "."
        self.action_space = action_text_space()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.side = int(self.np_random.integers(len(self.names)))
        self.obs = {"text": f"The coin shows {self.side}."}
        return self.obs, {"success": False}

    def step(self, action):
        index = parse_action(action, self.names)
        if index is None:
            return invalid_step(self.obs, False)
        won = index == self.side
        return self.obs, float(won), True, False, {"success": won, "action_is_valid": True}


def coin(**kwargs):
    return Coin(**kwargs)


def not_an_env():
    return {"reset": None}


class NoStep(gym.Env):
    def reset(self, *, seed=None, options=None):
        return {"text": ""}, {}


class Exploding(gym.Env):
    def __init__(self, size: int = 1):
        raise AssertionError("check_env must not build")


NOT_CALLABLE = 3
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_env.py"
    path.write_text(textwrap.dedent(USER_ENV))
    return str(path)


def test_the_built_ins_are_registered():
    assert {"bandit", "frozenlake", "sokoban"} <= set(ENVIRONMENTS.names())
    assert isinstance(make_env("bandit"), Bandit)
    assert isinstance(make_env("frozenlake", {"size": 5}), FrozenLake)
    env = make_env("sokoban", {"size": 7, "num_boxes": 2})
    assert isinstance(env, Sokoban) and env.reset(seed=0)[0]["image"].size == (196, 196)


def test_a_user_env_builds_from_a_file_reference(user_file):
    for ref in (f"{user_file}:Coin", f"{user_file}:coin"):
        check_env(ref, {"sides": 3})
        env = make_env(ref, {"sides": 3})
        obs, _ = env.reset(seed=0)
        side = obs["text"].split()[-1].rstrip(".")
        _, reward, terminated, _, info = env.step(side)
        assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert isinstance(make_env("envs.sokoban:Sokoban"), Sokoban)


def test_unknown_names_list_the_valid_ones():
    for fn in (make_env, check_env):
        with pytest.raises(ValueError, match=r"^config key 'env.name': unknown environment 'sokobna'; valid names: "
                                             r"bandit, frozenlake, matching, signal, sokoban, 'gym:<id>'"):
            fn("sokobna")
    with pytest.raises(ValueError, match=r"^config key 'eval.env.name': .*valid names"):
        make_env("", field="eval.env.name")


def test_rejected_kwargs_are_named_by_their_key():
    for fn in (make_env, check_env):
        with pytest.raises(ValueError, match=r"^config key 'env.sise': environment 'sokoban' takes no argument "
                                             r"'sise'; its arguments: size, num_boxes"):
            fn("sokoban", {"sise": 5})
    with pytest.raises(ValueError, match=r"^config key 'train.env.colour':"):
        check_env("bandit", {"colour": "red"}, field="train.env.name")


def test_bad_references_and_built_objects_are_explained(user_file):
    cases = {
        f"{user_file}:NOT_CALLABLE": "not callable",
        f"{user_file}:not_an_env": "not a gymnasium.Env",
        f"{user_file}:NoStep": "does not define step",
        f"{user_file}:Missing": "has no attribute 'Missing'",
        "no_such_module_xyz:Env": "cannot import module",
    }
    for ref, message in cases.items():
        with pytest.raises(ValueError, match=rf"^config key 'env.name': .*{message}"):
            make_env(ref)
    with pytest.raises(ValueError, match=r"^config key 'env.name': building environment .* sides must be at least 2"):
        make_env(f"{user_file}:Coin", {"sides": 1})


def test_check_env_validates_without_building(user_file, monkeypatch):
    check_env(f"{user_file}:Exploding", {"size": 2})
    with pytest.raises(ValueError, match="config key 'env.width'"):
        check_env(f"{user_file}:Exploding", {"width": 2})
    monkeypatch.setattr(gym, "make", lambda *a, **k: pytest.fail("check_env built a gymnasium env"))
    check_env("gym:FrozenLake-v1", {"is_slippery": False, "max_episode_steps": 10})
    with pytest.raises(ValueError, match=r"^config key 'env.name': 'gym:FrozenLak-v1' is not a registered "
                                         r"gymnasium environment.*close matches: FrozenLake-v1"):
        check_env("gym:FrozenLak-v1")
    with pytest.raises(ValueError, match=r"^config key 'env.slippery': gymnasium environment 'FrozenLake-v1' "
                                         r"takes no argument 'slippery'; its arguments: .*is_slippery"):
        check_env("gym:FrozenLake-v1", {"slippery": True})
    with pytest.raises(ValueError, match=r"^config key 'env.render_mode': render_mode is set by the adapter"):
        check_env("gym:FrozenLake-v1", {"render_mode": "human"})


def test_envs_imports_no_other_mmrl_package(repo_root):
    forbidden = {"mmrl", "vlm", "diffusion", "shapes_world"}
    folder = os.path.join(repo_root, "envs")
    for name in os.listdir(folder):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not {m.split(".")[0] for m in modules} & forbidden, f"envs/{name} imports {modules}"
