"""The run's tools (the top-level `tools:` list) and what happens to the calls of one reply.

A `tools:` entry is like a reward's: a registered name (`tools.registry.TOOLS`), 'module:fn' or
'path/to/file.py:fn', with

    label      the name the model calls it by (default: the function's name)
    timeout_s  seconds one call may take (default 10)
    max_chars  characters of a result's text shown to the model (default 2000; the rest is cut)

and every other key a setting of the tool (its keyword-only parameters, `tools.function`); or an MCP server's
tools, `{mcp: "python my_server.py"}` or `{mcp: "http://host:port/mcp"}` (`tools.mcp_tools`).

Every failure of a call becomes a tool result the model reads, never a traceback, and is counted by kind:

    malformed      the call does not parse (not JSON, no name, an unclosed block)
    unknown_tool   no tool of that name
    bad_arguments  the arguments do not fit the tool's schema
    timeout        the call took longer than its timeout_s
    exception      the tool raised
    limit          the episode already made env.max_tool_calls calls
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from tools.formats import TOOL_FORMATS, ParsedCall, ToolFormat
from tools.function import FunctionTool, ToolFailed, ToolResult
from tools.mcp_tools import MCP_KEYS, check_target, mcp_tools
from tools.registry import TOOLS

ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "timeout", "exception", "limit")
RESERVED = ("name", "label", "timeout_s", "max_chars")


@dataclass(frozen=True)
class ToolSpec:
    """One `tools:` entry, parsed (not yet imported)."""

    name: str                 # registered name or reference
    label: str | None         # None: the function's name
    timeout_s: float
    max_chars: int
    settings: dict
    mcp: dict | None = None   # an MCP entry (its keys, `tools.mcp_tools`), or None for a function


@dataclass(frozen=True)
class CallRecord:
    """One call of an episode, as its sample's meta keeps it (JSON-friendly)."""

    name: str                 # the tool called ('' when the call did not parse)
    arguments: Any
    error: str | None         # one of ERROR_KINDS, or None
    result: str               # the text the model was shown
    images: int = 0           # images the result showed

    def as_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments, "error": self.error, "result": self.result,
                "images": self.images}


def parse_tools(entries: list, key: str = "tools") -> list[ToolSpec]:
    """The config's `tools:` list -> specs; errors name the entry's key."""
    specs = []
    for i, e in enumerate(entries):
        if isinstance(e, str):
            e = {"name": e}
        if isinstance(e, dict) and "mcp" in e:
            specs.append(_mcp_spec(e, f"{key}[{i}]"))
            continue
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"].strip():
            raise ValueError(f"config key '{key}[{i}]' must be a mapping with a 'name' (a registered tool: "
                             f"{TOOLS.valid()}), got {e!r}")
        timeout, chars = _limits(e, f"config key '{key}[{i}]' ({e['name']})")
        label = e.get("label")
        specs.append(ToolSpec(e["name"], None if label is None else str(label), timeout, chars,
                              {k: v for k, v in e.items() if k not in RESERVED}))
    return specs


def _limits(e: dict, where: str, extra: tuple[str, ...] = ()) -> tuple[float, int]:
    """An entry's (timeout_s, max_chars), checked; `extra`: more keys that must be numbers."""
    try:
        timeout, chars = float(e.get("timeout_s", 10.0)), int(e.get("max_chars", 2000))
        for k in extra:
            float(e.get(k, 0.0))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {', '.join(('timeout_s',) + extra)} and max_chars must be numbers: {err}") from None
    if timeout <= 0 or chars < 1:
        raise ValueError(f"{where}: timeout_s must be > 0 and max_chars >= 1, got {timeout:g} and {chars}")
    return timeout, chars


def _mcp_spec(e: dict, key: str) -> ToolSpec:
    unknown = [k for k in e if k not in MCP_KEYS]
    if unknown:
        raise ValueError(f"config key '{key}.{unknown[0]}': not a key of an MCP entry; its keys: {', '.join(MCP_KEYS)}")
    select = e.get("select")
    if select is not None and (not isinstance(select, list) or not all(isinstance(n, str) for n in select)):
        raise ValueError(f"config key '{key}.select' must be a list of the server's tool names, got {select!r}")
    timeout, chars = _limits(e, f"config key '{key}'", ("startup_timeout_s",))
    if e.get("env") is not None and not isinstance(e["env"], dict):
        raise ValueError(f"config key '{key}.env' must be a mapping of environment variables, got {e['env']!r}")
    return ToolSpec(f"mcp:{e['mcp']}", None, timeout, chars, {}, dict(e))


def _settings_error(fn, settings: dict) -> str | None:
    params = inspect.signature(fn).parameters.values()
    own = {p.name: p for p in params if p.kind is p.KEYWORD_ONLY}
    unknown = [k for k in settings if k not in own]
    if unknown:
        shown = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
        why = (f" ({unknown[0]!r} is an argument the model gives)" if unknown[0] in shown else "")
        return (f"takes no setting {unknown[0]!r}{why}; its settings (keyword-only parameters): "
                f"{', '.join(own) or 'none'}")
    missing = [n for n, p in own.items() if p.default is p.empty and n not in settings]
    if missing:
        return f"needs the setting {missing[0]!r} (a keyword-only parameter without a default)"
    return None


def check_tools(specs: list[ToolSpec], key: str = "tools") -> None:
    """What can be known without starting anything: each function imports and can be described, its settings
    fit, the names are distinct; an MCP entry's command exists (its tools are known once it runs)."""
    build_tools([s for s in specs if s.mcp is None], key, [i for i, s in enumerate(specs) if s.mcp is None])
    for i, s in enumerate(specs):
        if s.mcp is not None:
            check_target(s.mcp["mcp"], f"{key}[{i}].mcp")


def build_tools(specs: list[ToolSpec], key: str = "tools", index: list[int] | None = None,
                log_dir: str | None = None) -> list:
    """Import and describe each tool, start each MCP server (ValueError naming the entry's key on any problem).
    `index`: the entries' positions in the config list (default: 0, 1, ...); `log_dir`: where MCP stdio servers'
    stderr goes (None: this process's stderr)."""
    tools, names = [], {}
    for i, s in zip(index or range(len(specs)), specs):
        if s.mcp is not None:
            for tool in mcp_tools(s.mcp, f"{key}[{i}]", s.timeout_s, s.max_chars, log_dir):
                if tool.name in names:
                    raise ValueError(f"config key '{key}[{i}]': the MCP server's tool {tool.name!r} has the name of "
                                     f"tools[{names[tool.name]}]'s; offer a subset with 'select:' or relabel the other")
                names[tool.name] = i
                tools.append(tool)
            continue
        where = f"config key '{key}[{i}].name'"
        try:
            fn = TOOLS.resolve(s.name, f"{key}[{i}].name")
        except ValueError as e:
            raise ValueError(str(e)) from None
        if not callable(fn):
            raise ValueError(f"{where}: {s.name!r} resolves to {fn!r}, which is not a function")
        problem = _settings_error(fn, s.settings)
        if problem:
            raise ValueError(f"config key '{key}[{i}]': tool {s.name!r} {problem}")
        label = s.label or getattr(fn, "__name__", s.name.rsplit(":", 1)[-1])
        if label in names:
            raise ValueError(f"config key '{key}[{i}]': the tool name {label!r} is also tools[{names[label]}]'s; "
                             "set 'label:' to tell them apart")
        names[label] = i
        try:
            tools.append(FunctionTool(label, fn, dict(s.settings), s.timeout_s, s.max_chars))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return tools


class ToolBox:
    """The run's tools, their call format and the per-episode limit; `run` answers one reply's calls."""

    def __init__(self, tools: list, fmt: ToolFormat, max_calls: int):
        self.tools = {t.name: t for t in tools}
        self.format, self.max_calls = fmt, max_calls

    @classmethod
    def from_config(cls, entries: list, fmt: str, max_calls: int, log_dir: str | None = None) -> "ToolBox":
        """The run's tools (MCP servers started now; their stderr in `log_dir`)."""
        return cls(build_tools(parse_tools(list(entries)), log_dir=log_dir), TOOL_FORMATS.resolve(fmt, "env.tool_format"),
                   max_calls)

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def has_calls(self, reply: str) -> bool:
        return self.format.has_calls(reply)

    def _one(self, call: ParsedCall, observation: dict, used: int) -> tuple[CallRecord, ToolResult]:
        try:
            if used >= self.max_calls:
                raise ToolFailed("limit", f"this episode already made its {self.max_calls} tool calls "
                                          "(env.max_tool_calls); answer without tools")
            if call.problem:
                raise ToolFailed("malformed", call.problem)
            tool = self.tools.get(call.name)
            if tool is None:
                raise ToolFailed("unknown_tool", f"there is no tool {call.name!r}; the tools are: {', '.join(self.tools)}")
            result = tool.call(call.arguments, observation)
        except ToolFailed as failed:
            result = ToolResult(f"Error ({failed.kind}): {failed}")
            return CallRecord(call.name, call.arguments, failed.kind, result.text), result
        return CallRecord(call.name, call.arguments, None, result.text, len(result.images)), result

    def run(self, reply: str, observation: dict, used: int) -> tuple[list[CallRecord], list[ToolResult]]:
        """Answer every call of `reply` in order; `used`: calls the episode made before this reply."""
        records, results = [], []
        for k, call in enumerate(self.format.parse(reply)):
            record, result = self._one(call, observation, used + k)
            records.append(record)
            results.append(result)
        return records, results
