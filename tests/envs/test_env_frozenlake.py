"""FrozenLake: maps per seed, the RAGEN text grid, the image, winning, holes, seeded slipping."""

from collections import deque

import numpy as np

from envs.frozenlake import FrozenLake

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def cells(text: str) -> dict[tuple[int, int], str]:
    return {(r, c): ch for r, row in enumerate(text.split("\n")) for c, ch in enumerate(row)}


def path_to(text: str, goal) -> list[str] | None:
    """Shortest action list from the player to a cell where goal(symbol) holds, through frozen cells only."""
    grid = cells(text)
    start = next(p for p, ch in grid.items() if ch == "P")
    seen, queue = {start: []}, deque([start])
    while queue:
        pos = queue.popleft()
        for name, (dr, dc) in MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt not in grid or nxt in seen:
                continue
            if goal(grid[nxt]):
                return seen[pos] + [name]
            if grid[nxt] == "_":
                seen[nxt] = seen[pos] + [name]
                queue.append(nxt)
    return None


def test_reset_draws_the_map_from_the_seed():
    texts = {FrozenLake().reset(seed=s)[0]["text"] for s in range(12)}
    assert len(texts) > 6
    a, b = FrozenLake().reset(seed=7)[0], FrozenLake().reset(seed=7)[0]
    assert a["text"] == b["text"] and a["image"].tobytes() == b["image"].tobytes()


def test_text_grid_and_image_sizes():
    obs, _ = FrozenLake().reset(seed=1)
    rows = obs["text"].split("\n")
    assert len(rows) == 4 and all(len(r) == 4 for r in rows)
    assert rows[0][0] == "P" and rows[3][3] == "G" and set(obs["text"]) <= set("P_OG\n")
    assert (obs["image"].mode, obs["image"].size) == ("RGB", (112, 112))
    assert FrozenLake(size=6).reset(seed=1)[0]["image"].size == (168, 168)


def test_a_bfs_path_reaches_the_goal_with_reward_one():
    env = FrozenLake()
    obs, _ = env.reset(seed=3)
    path = path_to(obs["text"], lambda ch: ch == "G")
    assert path
    for i, action in enumerate(path):
        before = obs["image"].tobytes()
        obs, reward, terminated, truncated, info = env.step(action)
        last = i == len(path) - 1
        assert info["action_is_valid"] and not truncated and obs["image"].tobytes() != before
        assert (reward, terminated, info["success"]) == ((1.0, True, True) if last else (0.0, False, False))
    assert obs["text"].split("\n")[-1][-1] == "√" and "P" not in obs["text"]


def test_falling_into_a_hole_ends_the_episode_unsolved():
    for seed in range(50):
        env = FrozenLake()
        obs, _ = env.reset(seed=seed)
        path = path_to(obs["text"], lambda ch: ch == "O")
        if path:
            break
    for action in path:
        obs, reward, terminated, _, info = env.step(action)
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    assert "X" in obs["text"] and "P" not in obs["text"]


def trajectory(seed: int, actions: list[str]) -> list[str]:
    env = FrozenLake(slippery=True)
    texts = [env.reset(seed=seed)[0]["text"]]
    for action in actions:
        obs, _, terminated, _, _ = env.step(action)
        texts.append(obs["text"])
        if terminated:
            break
    return texts


def test_slipping_is_seeded_by_the_reset_seed():
    actions = ["right", "down"] * 6
    assert all(trajectory(s, actions) == trajectory(s, actions) for s in range(8))
    env = FrozenLake(slippery=True)
    env.reset(seed=0)
    first = [env.step("right")[0]["text"] for _ in range(3)]
    env.reset(seed=0)
    assert [env.step("right")[0]["text"] for _ in range(3)] == first   # re-seeding replays the slips


def test_slippery_mode_really_slips():
    slipped = 0
    for seed in range(10):
        env = FrozenLake(slippery=True, p_frozen=1.0)
        env.reset(seed=seed)
        env.step("right")
        slipped += env.player != (0, 1)
    assert 0 < slipped < 10


def test_render_modes():
    env = FrozenLake()
    obs, _ = env.reset(seed=0)
    assert np.array_equal(env.render(), np.asarray(obs["image"]))
    ansi = FrozenLake(render_mode="ansi")
    assert ansi.reset(seed=0)[0]["text"] == ansi.render()
