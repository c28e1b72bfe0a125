"""A Python function as a tool: its JSON schema, its arguments checked, its call bounded in time, its result
made into what the model is shown.

The schema is transformers' `get_json_schema` of the function (type hints and a Google-style docstring with
an `Args:` line per argument), the format chat templates take in `apply_chat_template(tools=...)`. Which of
the function's parameters the model fills:

    def zoom(region: str, observation: dict, *, scale: int = 2) -> Image.Image:
             ^ the model        ^ injected          ^ a setting: the config entry's keys, never shown

- positional-or-keyword parameters are the model's arguments (in the schema);
- a parameter named `observation` receives the environment's current observation (a dict with "text" and/or
  "image"), so a tool can look at what the model sees (the built-in `zoom` and `crop`);
- keyword-only parameters (after `*`) are settings, given by the tool's config entry; a required one that the
  entry does not give is a config error.

A result may be a string, a PIL image or an HxWx3 uint8 array, a list or tuple of those, or anything else
JSON can write (a dict, a number); images become images in the next turn, everything else text.
"""

from __future__ import annotations

import inspect
import json
import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

OBSERVATION = "observation"          # the injected parameter's name


class ToolFailed(Exception):
    """A call that did not produce a result: `kind` is one of `tools.box.ERROR_KINDS`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ToolResult:
    """What one call returned: text (possibly truncated) and images, in that order in the next turn."""

    text: str
    images: tuple = ()
    truncated: int = 0               # characters cut from the text (0 = none)


def _model_parameters(fn: Callable) -> list[inspect.Parameter]:
    params = inspect.signature(fn).parameters.values()
    return [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY) and p.name != OBSERVATION]


def json_schema(fn: Callable, name: str | None = None) -> dict:
    """The OpenAI-style schema `{"type": "function", "function": {...}}` of the model's parameters of `fn`
    (transformers' `get_json_schema` of `fn` without its injected and setting parameters). ValueError
    when the function cannot be described (a parameter without a type hint or an `Args:` line)."""
    from transformers.utils import get_json_schema

    signature = inspect.signature(fn)
    kept = _model_parameters(fn)
    if any(p.kind is p.VAR_POSITIONAL or p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        raise ValueError(f"tool {getattr(fn, '__name__', fn)!r} takes *args or **kwargs; a tool's arguments must be "
                         "named parameters with type hints (the model is shown their JSON schema)")

    def shown(*args, **kwargs):  # only described, never called
        raise AssertionError

    shown.__signature__ = signature.replace(parameters=kept, return_annotation=inspect.Signature.empty)
    try:
        hints = typing.get_type_hints(fn)        # resolved in the function's own module (string annotations too)
    except Exception as e:
        raise ValueError(f"tool {name or getattr(fn, '__name__', fn)!r}: its type hints cannot be resolved: {e}") from None
    shown.__annotations__ = {p.name: hints[p.name] for p in kept if p.name in hints}
    shown.__doc__ = inspect.getdoc(fn)
    shown.__name__ = name or fn.__name__
    try:
        schema = get_json_schema(shown)
    except Exception as e:  # transformers raises its own exception types (TypeHintParsingException, ...)
        raise ValueError(f"tool {shown.__name__!r} cannot be described to the model: {e}; a tool needs a type hint "
                         "for each argument and a Google-style docstring with an `Args:` line for each") from None
    schema["function"].pop("return", None)
    return schema


_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list,), "object": (dict,), "null": (type(None),)}


def _type_error(value: Any, schema: dict, where: str) -> str | None:
    """Why `value` does not fit `schema` (type, enum, array items, nullable), or None."""
    if value is None and schema.get("nullable"):
        return None
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        ok = any(isinstance(value, _JSON_TYPES.get(t, (object,))) and not (t in ("integer", "number") and isinstance(value, bool))
                 for t in types)
        if not ok:
            return f"{where} must be {' or '.join(types)}, got {json.dumps(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            err = _type_error(item, schema["items"], f"{where}[{i}]")
            if err:
                return err
    return None


def check_arguments(parameters: dict, arguments: Any) -> str | None:
    """Why `arguments` (the parsed JSON of a call) do not fit the schema's `parameters`, or None."""
    if not isinstance(arguments, dict):
        return f"the arguments must be a JSON object, got {json.dumps(arguments)}"
    props, required = parameters.get("properties", {}), parameters.get("required", [])
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return f"unknown argument {unknown[0]!r}; the arguments are: {', '.join(props) or 'none'}"
    missing = [k for k in required if k not in arguments]
    if missing:
        return f"missing required argument {missing[0]!r}"
    for k, v in arguments.items():
        err = _type_error(v, props[k], f"argument {k!r}")
        if err:
            return err
    return None


def to_result(value: Any, max_chars: int) -> ToolResult:
    """A function's return value as text and images (module docstring); text over `max_chars` is cut."""
    import numpy as np
    from PIL import Image

    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    texts, images = [], []
    for part in parts:
        if isinstance(part, Image.Image):
            images.append(part.convert("RGB"))
        elif isinstance(part, np.ndarray) and part.ndim == 3 and part.shape[-1] == 3 and part.dtype == np.uint8:
            images.append(Image.fromarray(part))
        elif isinstance(part, str):
            texts.append(part)
        elif part is not None:
            texts.append(json.dumps(part, ensure_ascii=False, default=str))
    text = "\n".join(texts)
    cut = max(0, len(text) - max_chars)
    if cut:
        text = text[:max_chars] + f"... [{cut} more characters cut]"
    return ToolResult(text, tuple(images), cut)


@dataclass(eq=False)
class FunctionTool:
    """A Python function the model may call (module docstring). `settings`: its keyword-only arguments."""

    name: str
    fn: Callable
    settings: dict = field(default_factory=dict)
    timeout_s: float = 10.0
    max_chars: int = 2000
    schema: dict = field(init=False)

    def __post_init__(self):
        self.schema = json_schema(self.fn, self.name)
        self._wants_observation = OBSERVATION in inspect.signature(self.fn).parameters

    def call(self, arguments: dict, observation: dict) -> ToolResult:
        """Run the tool on the model's `arguments`; `ToolFailed` with kind bad_arguments, timeout or exception.

        The function runs in a daemon thread joined for `timeout_s`: a call that times out is reported at once
        and its thread is left to finish on its own (a Python thread cannot be stopped; the sandboxed Python tool
        runs code in a process it can kill)."""
        problem = check_arguments(self.schema["function"]["parameters"], arguments)
        if problem:
            raise ToolFailed("bad_arguments", problem)
        kwargs = dict(arguments, **self.settings)
        if self._wants_observation:
            kwargs[OBSERVATION] = observation
        box: dict = {}

        def run():
            try:
                box["value"] = self.fn(**kwargs)
            except BaseException as e:  # reported to the model, never raised in the episode
                box["error"] = e

        thread = threading.Thread(target=run, name=f"mmrl-tool-{self.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise ToolFailed("timeout", f"the call took longer than {self.timeout_s:g} s")
        if "error" in box:
            e = box["error"]
            raise ToolFailed("exception", f"{type(e).__name__}: {e}")
        return to_result(box.get("value"), self.max_chars)
