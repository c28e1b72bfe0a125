"""The tools of an MCP server (the Model Context Protocol, modelcontextprotocol.io), through the `mcp` package.

A `tools:` entry `{mcp: "python my_server.py --flag"}` starts that command as a stdio server when the policy is
built (each process of the run, each rollout worker, starts its own) and keeps one session open for the run;
`{mcp: "http://host:port/mcp"}` connects to a server that is already running, over streamable HTTP. Every tool the
server lists becomes a tool of the run (or those named in `select:`), described to the model by the server's own
`inputSchema`. Keys besides `mcp`:

    select              the server's tools to offer (default: all)
    timeout_s           seconds one call may take (default 10)
    max_chars           characters of a result's text shown (default 2000)
    startup_timeout_s   seconds the server may take to start and list its tools (default 30)
    env, cwd            the stdio server's extra environment variables and working directory

A stdio server's stderr (its logs and tracebacks) goes to `<output_dir>/tools/mcp_<entry>.log`, not to the run's
terminal. A result's text blocks become text and its image blocks images; a result the server marks `isError` is reported
to the model as an `exception`, as is a call that fails in transport (a server that died). The session runs on an
asyncio loop in a thread of its own, so the episode loop calls tools synchronously.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import io
import os
import shlex
import shutil
import threading
from typing import Any

from tools.function import ToolFailed, ToolResult, check_arguments, to_result

MCP_KEYS = ("mcp", "select", "timeout_s", "max_chars", "startup_timeout_s", "env", "cwd")


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def command_of(target) -> list[str]:
    """The stdio server's argv: a string is split as a shell would, a list is taken as it is."""
    return [str(a) for a in target] if isinstance(target, (list, tuple)) else shlex.split(str(target))


def check_target(target, key: str) -> None:
    """A stdio command whose program exists (and whose .py arguments exist), or an http(s) URL; ValueError naming
    `key` otherwise. Nothing is started."""
    if isinstance(target, str) and _is_url(target):
        return
    argv = command_of(target) if target else []
    if not argv:
        raise ValueError(f"config key '{key}': expected a command that starts an MCP stdio server (e.g. "
                         f"'python my_server.py') or an http(s):// URL of a running one, got {target!r}")
    if shutil.which(argv[0]) is None:
        raise ValueError(f"config key '{key}': the MCP server's program {argv[0]!r} is not found on PATH")
    missing = [a for a in argv[1:] if a.endswith(".py") and not os.path.exists(a)]
    if missing:
        raise ValueError(f"config key '{key}': the MCP server's script {missing[0]!r} does not exist "
                         f"(relative paths are taken from the run's working directory {os.getcwd()})")
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ValueError(f"config key '{key}': MCP tools need the `mcp` package: pip install 'mcp>=1.2'") from None


class McpServer:
    """One MCP session, open for the life of the process (module docstring)."""

    def __init__(self, target, env: dict | None = None, cwd: str | None = None, startup_timeout_s: float = 30.0,
                 key: str = "tools", log: str | None = None):
        self.target, self.env, self.cwd, self.key = target, env, cwd, key
        self.log = None
        if log is not None and not (isinstance(target, str) and _is_url(target)):
            os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
            self.log = open(log, "a", encoding="utf-8")          # the stdio server's stderr
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.tools: list = []
        self._thread = threading.Thread(target=self._serve, name="mmrl-mcp", daemon=True)
        self._thread.start()
        if not self._ready.wait(startup_timeout_s):
            self.close()
            raise ValueError(f"config key '{key}': the MCP server {target!r} did not start and list its tools within "
                             f"{startup_timeout_s:g} s (startup_timeout_s)")
        if self._error is not None:
            raise ValueError(f"config key '{key}': the MCP server {target!r} could not be started: "
                             f"{type(self._error).__name__}: {self._error}") from None
        atexit.register(self.close)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._session())
        except BaseException as e:  # reported to the caller of __init__, or to the next call
            self._error = e
            self._ready.set()

    def _transport(self):
        if isinstance(self.target, str) and _is_url(self.target):
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.target)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        argv = command_of(self.target)
        env = {**os.environ, **{k: str(v) for k, v in (self.env or {}).items()}}
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=self.cwd)
        return stdio_client(params, errlog=self.log) if self.log is not None else stdio_client(params)

    async def _session(self) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        async with self._transport() as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                self.session, self.tools = session, list(listed.tools)
                self._ready.set()
                await self._stop.wait()

    def call(self, name: str, arguments: dict, timeout_s: float):
        """The server's CallToolResult; ToolFailed (timeout, exception) when there is none."""
        if self._error is not None or not self._thread.is_alive():
            raise ToolFailed("exception", f"the MCP server is not running ({type(self._error).__name__}: {self._error})"
                             if self._error else "the MCP server is not running")
        future = asyncio.run_coroutine_threadsafe(self.session.call_tool(name, arguments), self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise ToolFailed("timeout", f"the call took longer than {timeout_s:g} s") from None
        except Exception as e:
            raise ToolFailed("exception", f"the MCP call failed: {type(e).__name__}: {e}") from None

    def close(self) -> None:
        """End the session (a stdio server is terminated by the `mcp` client) and the loop's thread."""
        if self._thread.is_alive() and getattr(self, "_stop", None) is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        if self.log is not None and not self._thread.is_alive():
            self.log.close()


class McpTool:
    """One tool of an `McpServer`, called like a `tools.FunctionTool`."""

    def __init__(self, server: McpServer, tool, timeout_s: float, max_chars: int):
        self.server, self.name, self.timeout_s, self.max_chars = server, tool.name, timeout_s, max_chars
        schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)   # mcp 2.x / 1.x
        parameters = dict(schema or {"type": "object", "properties": {}})
        self.schema = {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                                        "parameters": parameters}}

    def call(self, arguments: dict, observation: dict) -> ToolResult:
        problem = check_arguments(self.schema["function"]["parameters"], arguments)
        if problem:
            raise ToolFailed("bad_arguments", problem)
        result = self.server.call(self.name, arguments, self.timeout_s)
        parts = _parts(getattr(result, "content", []) or [])
        if getattr(result, "isError", False) or getattr(result, "is_error", False):
            text = "\n".join(p for p in parts if isinstance(p, str)) or "the server reported an error"
            raise ToolFailed("exception", text)
        return to_result(parts, self.max_chars)


def _parts(content: list) -> list[Any]:
    """An MCP result's content blocks as text and PIL images (other blocks as their JSON)."""
    from PIL import Image

    out: list[Any] = []
    for block in content:
        kind = getattr(block, "type", None)
        if kind == "text":
            out.append(block.text)
        elif kind == "image":
            out.append(Image.open(io.BytesIO(base64.b64decode(block.data))).convert("RGB"))
        else:
            dump = getattr(block, "model_dump", None)
            out.append(dump(mode="json") if dump else str(block))
    return out


def mcp_tools(entry: dict, key: str, timeout_s: float, max_chars: int, log_dir: str | None = None) -> list[McpTool]:
    """Start (or connect to) the server of a `tools:` entry and wrap the tools it lists (`select`: a subset), each
    call bounded by `timeout_s` and its text by `max_chars`. `log_dir`: where a stdio server's stderr goes
    (`mcp_<entry index>.log`); None: the run's stderr."""
    index = key.rsplit("[", 1)[-1].rstrip("]")
    log = os.path.join(log_dir, f"mcp_{index}.log") if log_dir else None
    server = McpServer(entry["mcp"], entry.get("env"), entry.get("cwd"), float(entry.get("startup_timeout_s", 30)), key,
                       log)
    listed = {t.name: t for t in server.tools}
    select = entry.get("select")
    if select is not None:
        missing = [n for n in select if n not in listed]
        if missing:
            server.close()
            raise ValueError(f"config key '{key}.select': the MCP server {entry['mcp']!r} has no tool {missing[0]!r}; "
                             f"its tools: {', '.join(listed) or 'none'}")
    names = list(select) if select is not None else list(listed)
    return [McpTool(server, listed[n], timeout_s, max_chars) for n in names]
