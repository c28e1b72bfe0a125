"""The tools package on its own: schemas from signatures and docstrings, argument checks, results, the hermes
format's parser, the built-in visual tools, and the `tools:` config checked at load."""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pytest
from PIL import Image

from mmrl.config import ConfigError, load_config
from tools import TOOL_FORMATS, FunctionTool, ToolBox, ToolFailed, build_tools, json_schema, parse_tools
from tools.function import check_arguments, to_result

HERE = os.path.dirname(__file__)
TOOLS_FILE = os.path.join(os.path.dirname(HERE), "vlm", "agent_tools.py")
ENV_FILE = os.path.join(os.path.dirname(HERE), "vlm", "agent_env.py") + ":Corridor"


def measure(side: float, observation: dict, *, unit: str, digits: int = 2) -> str:
    """Measure a side.

    Args:
        side: The side's length.
    """
    return f"{round(side, digits)} {unit} (image {observation.get('image') is not None})"


def test_the_schema_holds_the_models_arguments_only():
    schema = json_schema(measure)
    assert schema == {"type": "function", "function": {
        "name": "measure", "description": "Measure a side.",
        "parameters": {"type": "object", "properties": {"side": {"type": "number", "description": "The side's length."}},
                       "required": ["side"]}}}
    tool = FunctionTool("measure", measure, {"unit": "cm"})
    assert tool.call({"side": 2.345}, {"image": None}).text == "2.35 cm (image False)"   # settings and observation given
    assert tool.call({"side": 1}, {"image": 1}).text == "1 cm (image True)"


def test_a_function_that_cannot_be_described_is_refused():
    def bare(x):
        return x

    def undocumented(x: int) -> int:
        """No Args section."""
        return x

    def star(*args: int) -> int:
        """Star.

        Args:
            args: numbers.
        """
        return 0

    for fn in (bare, undocumented, star):
        with pytest.raises(ValueError, match=f"tool '{fn.__name__}'"):
            json_schema(fn)


@pytest.mark.parametrize("arguments, problem", [
    ({"a": 1, "b": "x"}, None),
    ({"a": 1}, None),
    ({"a": 1.5}, "argument 'a' must be integer"),
    ({"a": True}, "argument 'a' must be integer"),
    ({"a": 1, "b": 3}, "argument 'b' must be string"),
    ({"a": 1, "c": [1, "x"]}, "argument 'c'[1] must be integer"),
    ({"a": 1, "e": "maybe"}, 'argument \'e\' must be one of ["yes", "no"]'),
    ({"b": "x"}, "missing required argument 'a'"),
    ({"a": 1, "z": 0}, "unknown argument 'z'"),
    ([1], "must be a JSON object"),
])
def test_arguments_are_checked_against_the_schema(arguments, problem):
    parameters = {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "array", "items": {"type": "integer"}},
        "e": {"type": "string", "enum": ["yes", "no"]}}}
    got = check_arguments(parameters, arguments)
    assert got is None if problem is None else problem in got


def test_results_become_text_and_images_and_long_text_is_cut():
    r = to_result(["a", {"k": 1}, np.zeros((4, 5, 3), np.uint8), Image.new("L", (3, 2))], max_chars=100)
    assert r.text == 'a\n{"k": 1}' and [im.size for im in r.images] == [(5, 4), (3, 2)]
    assert all(im.mode == "RGB" for im in r.images)
    r = to_result("x" * 30, max_chars=10)
    assert r.text == "x" * 10 + "... [20 more characters cut]" and r.truncated == 20
    assert to_result(None, 10).text == "" and to_result(3.5, 10).text == "3.5"


@pytest.mark.parametrize("reply, expected", [
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', [("f", {"x": 1}, "")]),
    ('a <tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call> b <tool_call>{"name": "g"}</tool_call>',
     [("f", {"x": 2}, ""), ("g", {}, "")]),
    ("<tool_call>{oops}</tool_call>", [("", None, "not valid JSON")]),
    ('<tool_call>{"arguments": {}}</tool_call>', [("", None, "must be a JSON object")]),
    ('<tool_call>["f"]</tool_call>', [("", None, "must be a JSON object")]),
    ('<tool_call>{"name": "f", "arguments": {}}', [("", None, "not closed")]),
    ("<answer>3</answer>", []),
])
def test_the_hermes_format_parses_calls(reply, expected):
    fmt = TOOL_FORMATS.resolve("hermes")
    got = fmt.parse(reply)
    assert fmt.has_calls(reply) == bool(expected)
    assert len(got) == len(expected)
    for c, (name, arguments, problem) in zip(got, expected):
        assert c.name == name and c.arguments == arguments and problem in c.problem and bool(problem) == bool(c.problem)


def test_a_timed_out_call_returns_at_once_and_others_go_on():
    box = ToolBox(build_tools(parse_tools([{"name": f"{TOOLS_FILE}:sleepy", "timeout_s": 0.1}])),
                  TOOL_FORMATS.resolve("hermes"), 4)
    start = time.monotonic()
    call = '<tool_call>{"name": "sleepy", "arguments": {"seconds": %s}}</tool_call>'
    records, results = box.run(call % 3 + call % 0.01, {}, 0)
    assert time.monotonic() - start < 1.5
    assert [r.error for r in records] == ["timeout", None] and results[1].text == "slept 0.01 s"
    with pytest.raises(ToolFailed, match="longer than 0.1 s") as e:
        box.tools["sleepy"].call({"seconds": 1}, {})
    assert e.value.kind == "timeout"


def test_zoom_and_crop_show_a_part_of_the_observation_at_full_size():
    from tools.visual import crop, zoom

    pixels = np.zeros((40, 60, 3), np.uint8)
    pixels[:20, :30] = (255, 0, 0)                                    # the top-left quarter is red
    obs = {"image": Image.fromarray(pixels)}
    z = zoom("top-left", obs)
    assert z.size == (60, 40) and np.asarray(z)[5:35, 5:55].min(axis=(0, 1)).tolist() == [255, 0, 0]
    c = crop(30, 20, 60, 40, obs)
    assert c.size == (60, 40) and np.asarray(c).max() == 0
    for bad in (lambda: zoom("middle", obs), lambda: crop(0, 0, 61, 10, obs), lambda: zoom("center", {"text": "x"})):
        with pytest.raises(ValueError):
            bad()
    assert json_schema(zoom)["function"]["parameters"]["properties"]["region"]["enum"][0] == "top-left"


def _load(tmp_path, tools, **extra):
    overrides = [f"output_dir={tmp_path}", "policy.name=vlm", "policy.model=tiny:qwen2_5_vl", "rewards=[{name: env_return}]",
                 f"env.name={ENV_FILE}", "train.prompts_per_step=2", "train.group_size=2", "train.samples_per_microbatch=2",
                 f"tools={json.dumps(tools)}"] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(None, overrides)


def test_the_tools_section_loads(tmp_path):
    cfg = _load(tmp_path, ["zoom", {"name": f"{TOOLS_FILE}:picture", "size": 56, "label": "paint", "timeout_s": 2}],
                **{"env.max_tool_calls": 3})
    assert cfg.env.max_tool_calls == 3 and cfg.env.tool_format == "hermes"
    assert [t.name for t in build_tools(parse_tools(list(cfg.tools)))] == ["zoom", "paint"]


@pytest.mark.parametrize("tools, extra, message", [
    (["nope"], {}, re.escape("config key 'tools[0].name': unknown tool 'nope'; valid names: crop, python, zoom")),
    ([f"{TOOLS_FILE}:missing"], {}, re.escape("config key 'tools[0].name':") + ".*has no attribute 'missing'"),
    ([{"name": f"{TOOLS_FILE}:picture", "colour": 1}], {},
     re.escape("config key 'tools[0]': tool '") + ".*takes no setting 'colour'; its settings .*: size"),
    ([{"name": f"{TOOLS_FILE}:picture", "color": "red"}], {}, "'color' is an argument the model gives"),
    ([{"name": "zoom", "timeout_s": 0}], {}, "config key 'tools\\[0\\]' \\(zoom\\): timeout_s must be > 0"),
    (["zoom", "zoom"], {}, "config key 'tools\\[1\\]': the tool name 'zoom' is also tools\\[0\\]'s"),
    ([{"label": "x"}], {}, "config key 'tools\\[0\\]' must be a mapping with a 'name'"),
    (["zoom"], {"env.tool_format": "xml"}, "config key 'env.tool_format': unknown tool-call format 'xml'; valid names: hermes"),
    (["zoom"], {"env.history_turns": 0}, "config key 'env.history_turns' is 0 with tools"),
    (["zoom"], {"env.max_tool_calls": 0}, "env.max_tool_calls"),
])
def test_a_bad_tools_entry_is_a_config_error_naming_its_key(tmp_path, tools, extra, message):
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, tools, **extra)


def test_a_tool_without_a_schema_is_a_config_error(tmp_path):
    path = tmp_path / "mytools.py"
    path.write_text("def f(x):\n    return x\n")
    with pytest.raises(ConfigError, match="config key 'tools\\[0\\].name': tool 'f' cannot be described"):
        _load(tmp_path, [f"{path}:f"])


def test_tools_need_an_env_section(tmp_path):
    with pytest.raises(ConfigError, match="config key 'tools': tools are called in an environment's episodes"):
        load_config(None, [f"output_dir={tmp_path}", "policy.name=vlm", "policy.model=tiny:qwen2_5_vl",
                           "rewards=[{name: format}]", "data.train=x.jsonl", 'tools=["zoom"]'])
