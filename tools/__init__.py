"""Tools an agent may call in its episodes (the top-level `tools:` list): Python functions described to the
model by their JSON schema (`tools.function`), an MCP server's tools (`tools.mcp_tools`), the built-ins (`tools.registry`), the call formats of model
families (`tools.formats`), and what becomes of one reply's calls (`tools.box`).

Like `rewards` and `envs`, this package imports neither the core nor an adapter; the VLM adapter's episodes
use it (vlm/episodes.py)."""

from tools.box import ERROR_KINDS, CallRecord, ToolBox, ToolSpec, build_tools, check_tools, parse_tools
from tools.formats import TOOL_FORMATS, ParsedCall, ToolFormat
from tools.function import FunctionTool, ToolFailed, ToolResult, json_schema
from tools.registry import TOOLS

__all__ = ["ERROR_KINDS", "CallRecord", "ToolBox", "ToolSpec", "build_tools", "check_tools", "parse_tools", "TOOL_FORMATS",
           "ParsedCall", "ToolFormat", "FunctionTool", "ToolFailed", "ToolResult", "json_schema", "TOOLS"]
