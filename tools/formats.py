"""How tool calls are written in a reply and how tools are announced: one entry per model family's format
(`env.tool_format`).

A format parses a reply's calls and, for chat templates that know nothing of tools, supplies what a
template that does would render: the tools' description in the system message and the tool results as
a user turn. Templates that render `tools=` themselves (Qwen2.5's, Qwen3's) are used as they are
(`vlm.turns.TurnTemplate`); a test checks that the fallback renders the same tokens as such a template.

hermes: Qwen2.5 / Qwen3 / Hermes-style calls, one JSON object per `<tool_call>` block:

    <tool_call>
    {"name": "zoom", "arguments": {"region": "top-left"}}
    </tool_call>

and results as a user turn of `<tool_response>` blocks, as Qwen2.5's template renders `role: tool`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rewards.lookup import Registry


@dataclass(frozen=True)
class ParsedCall:
    """A call as the reply wrote it: `name` and `arguments`, or `problem` (why it is malformed) and the raw text."""

    name: str = ""
    arguments: Any = None
    problem: str = ""
    raw: str = ""


class ToolFormat:
    """The calls of a reply, and the text a tool-less chat template lacks."""

    def has_calls(self, reply: str) -> bool:
        raise NotImplementedError

    def parse(self, reply: str) -> list[ParsedCall]:
        raise NotImplementedError

    def system_text(self, system: str, schemas: list[dict]) -> str:
        """The system message announcing `schemas` after `system`."""
        raise NotImplementedError

    def result_parts(self, results: list[tuple[str, tuple]]) -> list[dict]:
        """The content parts (chat-template form: {"type": "text", "text": ...} / {"type": "image"}) of the
        user turn that carries the (text, images) of each call's result."""
        raise NotImplementedError


TOOL_FORMATS: Registry[ToolFormat] = Registry("tool-call format")


class Hermes(ToolFormat):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def has_calls(self, reply: str) -> bool:
        return self.OPEN in reply

    def parse(self, reply: str) -> list[ParsedCall]:
        out = []
        for m in self.BLOCK.finditer(reply):
            body, closed = m.group(1), bool(m.group(2))
            raw = m.group(0)
            if not closed:
                out.append(ParsedCall(problem="the <tool_call> block is not closed by </tool_call>", raw=raw))
                continue
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as e:
                out.append(ParsedCall(problem=f"the call is not valid JSON ({e.msg} at character {e.pos})", raw=raw))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
                out.append(ParsedCall(problem='a call must be a JSON object {"name": <tool name>, "arguments": {...}}',
                                      raw=raw))
                continue
            args = obj.get("arguments", {})
            if isinstance(args, str):          # some models write the arguments as a JSON string
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            out.append(ParsedCall(obj["name"], args, raw=raw))
        return out

    def system_text(self, system: str, schemas: list[dict]) -> str:
        listed = "".join("\n" + json.dumps(s, ensure_ascii=False) for s in schemas)
        return (f"{system}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>{listed}\n</tools>"
                "\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")

    def result_parts(self, results: list[tuple[str, tuple]]) -> list[dict]:
        parts: list[dict] = []
        for i, (text, images) in enumerate(results):
            parts.append({"type": "text", "text": ("\n" if i else "") + "<tool_response>\n"})
            parts += [{"type": "image"} for _ in images]
            parts.append({"type": "text", "text": text + "\n</tool_response>"})
        return parts


TOOL_FORMATS.register("hermes")(Hermes())
