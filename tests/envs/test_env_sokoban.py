"""Sokoban: rooms per seed, solvability by construction, the gym-sokoban rewards, the RAGEN text grid."""

from collections import deque

import pytest

from envs.sokoban import Sokoban

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def parse(text: str):
    """(walls, targets, boxes, player) of a text grid in RAGEN's symbols."""
    grid = {(r, c): ch for r, row in enumerate(text.split("\n")) for c, ch in enumerate(row)}
    walls = {p for p, ch in grid.items() if ch == "#"}
    targets = frozenset(p for p, ch in grid.items() if ch in "O√S")
    boxes = frozenset(p for p, ch in grid.items() if ch in "X√")
    player = next(p for p, ch in grid.items() if ch in "PS")
    return walls, targets, boxes, player


def add(p, d, k=1):
    return p[0] + k * d[0], p[1] + k * d[1]


def successor(walls, state, d):
    """The state after moving by d (pushing a box when the cell beyond is free), or None when blocked."""
    player, boxes = state
    ahead = add(player, d)
    if ahead in walls:
        return None
    if ahead in boxes:
        beyond = add(ahead, d)
        if beyond in walls or beyond in boxes:
            return None
        boxes = (boxes - {ahead}) | {beyond}
    return ahead, boxes


def bfs(text: str, goal):
    """Shortest (actions, states) from the grid's state to one where goal(player, boxes) holds."""
    walls, _, boxes, player = parse(text)
    start = (player, boxes)
    parent = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if goal(*state):
            actions, states = [], [state]
            while parent[state] is not None:
                state, action = parent[state]
                actions.append(action)
                states.append(state)
            return actions[::-1], states[::-1]
        for name, d in MOVES.items():
            nxt = successor(walls, state, d)
            if nxt is not None and nxt not in parent:
                parent[nxt] = (state, name)
                queue.append(nxt)
    return None


def expected_rewards(targets, states) -> list[float]:
    """gym-sokoban: -0.1 per step, +1 / -1 per box onto / off a target, +10 when all are on targets."""
    rewards = []
    for (_, before), (_, after) in zip(states, states[1:]):
        on_before, on_after = len(before & targets), len(after & targets)
        rewards.append(-0.1 + (on_after - on_before) + (10.0 if on_after == len(after) else 0.0))
    return rewards


def test_rooms_depend_on_the_seed_and_repeat_with_it():
    rooms = [Sokoban().reset(seed=s)[0] for s in range(10)]
    assert len({o["text"] for o in rooms}) == 10
    again = Sokoban().reset(seed=4)[0]
    assert again["text"] == rooms[4]["text"] and again["image"].tobytes() == rooms[4]["image"].tobytes()


def test_text_grid_and_image():
    obs, _ = Sokoban().reset(seed=0)
    rows = obs["text"].split("\n")
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    assert rows[0] == rows[-1] == "######" and all(r[0] == r[-1] == "#" for r in rows)
    assert set(obs["text"]) <= set("#_OX√PS\n") and obs["text"].count("X") == 1
    assert obs["text"].count("P") + obs["text"].count("S") == 1
    assert (obs["image"].mode, obs["image"].size) == ("RGB", (168, 168))


@pytest.mark.parametrize("num_boxes, seeds", [(1, range(40)), (2, range(6))])
def test_every_generated_room_is_solved_by_bfs_with_the_specified_rewards(num_boxes, seeds):
    for seed in seeds:
        env = Sokoban(size=6 if num_boxes == 1 else 7, num_boxes=num_boxes)
        obs, _ = env.reset(seed=seed)
        _, targets, boxes, _ = parse(obs["text"])
        assert len(boxes) == num_boxes and boxes != targets
        found = bfs(obs["text"], lambda player, boxes: boxes <= targets)
        assert found is not None, f"seed {seed}: unsolvable room\n{obs['text']}"
        actions, states = found
        for i, (action, want) in enumerate(zip(actions, expected_rewards(targets, states))):
            obs, reward, terminated, truncated, info = env.step(action)
            last = i == len(actions) - 1
            assert reward == pytest.approx(want), f"seed {seed} step {i}"
            assert (terminated, info["success"], truncated) == (last, last, False)
        assert reward == pytest.approx(-0.1 + 1.0 + 10.0)
        assert "X" not in obs["text"] and obs["text"].count("√") == num_boxes


def test_pushing_a_box_into_a_wall_moves_nothing():
    for seed in range(40):
        env = Sokoban()
        obs, _ = env.reset(seed=seed)
        walls = parse(obs["text"])[0]

        def against_wall(player, boxes):
            return any(add(player, d) in boxes and add(player, d, 2) in walls for d in MOVES.values())

        found = bfs(obs["text"], against_wall)
        if found:
            break
    actions, states = found
    for action in actions:
        obs, *_ = env.step(action)
    player, boxes = states[-1]
    push = next(n for n, d in MOVES.items() if add(player, d) in boxes and add(player, d, 2) in walls)
    after, reward, terminated, _, info = env.step(push)
    assert after["text"] == obs["text"] and reward == pytest.approx(-0.1)
    assert not terminated and info["action_is_valid"] and not info["success"]


def test_pushing_a_box_off_a_target_costs_one():
    for seed in range(40):
        env = Sokoban(size=7, num_boxes=2)
        obs, _ = env.reset(seed=seed)
        walls, targets, _, _ = parse(obs["text"])

        def beside_placed_box(player, boxes):
            return any(add(player, d) in boxes & targets and add(player, d, 2) not in walls | boxes | targets
                       for d in MOVES.values())

        found = bfs(obs["text"], beside_placed_box)
        if found:
            break
    actions, states = found
    for action in actions:
        env.step(action)
    player, boxes = states[-1]
    push = next(n for n, d in MOVES.items()
                if add(player, d) in boxes & targets and add(player, d, 2) not in walls | boxes | targets)
    _, reward, terminated, _, _ = env.step(push)
    assert reward == pytest.approx(-1.1) and not terminated


def test_bad_sizes_are_errors():
    with pytest.raises(ValueError, match="size"):
        Sokoban(size=3)
    with pytest.raises(RuntimeError, match="larger size"):
        Sokoban(size=4, num_boxes=3, max_gen_tries=3).reset(seed=0)
