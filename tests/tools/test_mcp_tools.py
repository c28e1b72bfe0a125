"""An MCP server's tools (tools/mcp_tools.py) against a small server written with the `mcp` package
(tests/tools/mcp_server.py), over stdio (started by the tools) and over streamable HTTP (already running)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from mmrl.config import ConfigError, load_config
from tools import TOOL_FORMATS, ToolBox, build_tools, check_tools, parse_tools

pytest.importorskip("mcp")
HERE = os.path.dirname(__file__)
SERVER = os.path.join(HERE, "mcp_server.py")
ENV_FILE = os.path.join(os.path.dirname(HERE), "vlm", "agent_env.py") + ":Corridor"


def call(name: str, **arguments) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def box_of(entries, max_calls=10) -> ToolBox:
    return ToolBox(build_tools(parse_tools(entries)), TOOL_FORMATS.resolve("hermes"), max_calls)


@pytest.fixture(scope="module")
def stdio_box():
    box = box_of([{"mcp": f"{sys.executable} {SERVER}", "timeout_s": 1.0}])
    yield box
    for tool in box.tools.values():
        tool.server.close()


def test_a_stdio_servers_tools_are_described_by_its_schemas(stdio_box):
    assert stdio_box.names == ["add", "swatch", "fail", "slow", "crash"]
    add = stdio_box.schemas[0]["function"]
    assert add["name"] == "add" and add["description"] == "Add two integers."
    assert add["parameters"]["properties"]["a"]["type"] == "integer" and add["parameters"]["required"] == ["a", "b"]


def test_results_and_failures_of_a_stdio_server(stdio_box):
    records, results = stdio_box.run(call("add", a=2, b=3) + call("swatch", color="blue"), {}, 0)
    assert [r.error for r in records] == [None, None]
    assert results[0].text == "5" and results[1].text == "a blue swatch"
    (image,) = results[1].images
    assert image.size == (16, 16) and image.getpixel((3, 3)) == (0, 0, 255)
    start = time.monotonic()
    records, _ = stdio_box.run(call("fail", message="no such file") + call("slow", seconds=5) + call("add", a="x", b=1)
                               + call("add", a=1, b=1), {}, 0)
    assert [r.error for r in records] == ["exception", "timeout", "bad_arguments", None]
    assert "no such file" in records[0].result and records[1].result == "Error (timeout): the call took longer than 1 s"
    assert records[3].result == "2"                                   # the session goes on after a timeout
    assert time.monotonic() - start < 4


def test_a_server_that_dies_is_an_exception_for_every_later_call():
    box = box_of([{"mcp": [sys.executable, SERVER], "select": ["crash", "add"]}])
    assert box.names == ["crash", "add"]
    records, _ = box.run(call("crash") + call("add", a=1, b=2), {}, 0)
    assert [r.error for r in records] == ["exception", "exception"]
    assert "MCP" in records[1].result


def test_a_running_server_over_http(free_port):
    port = free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        box = box_of([{"mcp": f"http://127.0.0.1:{port}/mcp", "select": ["add"]}])
        records, _ = box.run(call("add", a=20, b=22), {}, 0)
        assert records[0].error is None and records[0].result == "42"
        box.tools["add"].server.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_select_naming_no_tool_of_the_server_is_refused():
    with pytest.raises(ValueError, match="config key 'tools\\[0\\].select': the MCP server .* has no tool 'search'; "
                                         "its tools: add, swatch, fail, slow, crash"):
        box_of([{"mcp": f"{sys.executable} {SERVER}", "select": ["add", "search"]}])


@pytest.mark.parametrize("entry, message", [
    ({"mcp": "no-such-program --x"}, "config key 'tools\\[0\\].mcp': the MCP server's program 'no-such-program' is not found"),
    ({"mcp": f"{sys.executable} missing_server.py"}, "the MCP server's script 'missing_server.py' does not exist"),
    ({"mcp": ""}, "config key 'tools\\[0\\].mcp': expected a command .* got ''$"),
    ({"mcp": "python s.py", "label": "x"}, "config key 'tools\\[0\\].label': not a key of an MCP entry"),
    ({"mcp": "python s.py", "select": "add"}, "config key 'tools\\[0\\].select' must be a list"),
])
def test_a_bad_mcp_entry_is_a_config_error(tmp_path, entry, message):
    import json

    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"output_dir={tmp_path}", "policy.name=vlm", "policy.model=tiny:qwen2_5_vl",
                           "rewards=[{name: env_return}]", f"env.name={ENV_FILE}", f"tools={json.dumps([entry])}"])


def test_loading_a_config_starts_no_server(tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "server.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    check_tools(parse_tools([{"mcp": f"{sys.executable} {script}"}]))
    assert not marker.exists()
