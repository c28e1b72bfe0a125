"""Row converters from public VLM RL dataset layouts to the mmrl record schema.

The mmrl schema (what the VLM policy reads from `PromptBatch.rows`):
    prompt   str, the user's question; `<image>` marks where images go (else images come first)
    images   list of image references (see `vlm.images`), possibly empty
    answer   the reference answer (any JSON value), passed to rewards as `Sample.answer`
    system   optional per-row system prompt (overrides `policy.system_prompt`)
    ...      every other column is passed to rewards in `Sample.meta`

Converters (`format=` of `vlm.data:load`; `auto` picks one from the first row's columns):
    mmrl     the schema itself; `problem` is accepted for `prompt`, `image` for `images`
    easyr1   EasyR1 (hiyouga/EasyR1): `problem`, `answer`, `images`
    trl      TRL GRPO: `prompt` as chat messages, `image` or `images`, `solution` or `answer`
    verl     veRL parquet (examples/data_preprocess/geo3k.py): `prompt` messages,
             `images` [{bytes, path}], `reward_model.ground_truth`; data_source etc. kept as meta
Each converter raises `RowError` with the reason; the reader adds the file and row.
"""

from __future__ import annotations

from mmrl.registry import Registry

IMAGE_MARK = "<image>"


class RowError(ValueError):
    """A record that does not fit the schema (the reader prefixes file and row)."""


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _text(value, field: str) -> str:
    if not isinstance(value, str):
        raise RowError(f"'{field}' must be a string, got {type(value).__name__}")
    return value


def mmrl(row: dict) -> dict:
    out = dict(row)
    if "prompt" not in out and "problem" in out:
        out["prompt"] = out.pop("problem")
    if "images" not in out and "image" in out:
        out["images"] = out.pop("image")
    if "prompt" not in out:
        raise RowError(f"no 'prompt' (or 'problem') column; columns are {sorted(row)}")
    out["prompt"] = _text(out["prompt"], "prompt")
    out["images"] = _as_list(out.get("images"))
    return out


def easyr1(row: dict) -> dict:
    if "problem" not in row:
        raise RowError(f"EasyR1 rows need 'problem'; columns are {sorted(row)}")
    out = {k: v for k, v in row.items() if k not in ("problem", "images", "image")}
    out["prompt"] = _text(row["problem"], "problem")
    out["images"] = _as_list(row.get("images", row.get("image")))
    return out


def _messages(messages, field: str) -> tuple[str | None, str]:
    """(system text, user text with `<image>` at each image part) of a chat message list."""
    if isinstance(messages, str):
        return None, messages
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RowError(f"'{field}' must be a list of chat messages, got {type(messages).__name__}")
    system, user = None, []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise RowError(f"'{field}' holds a message without a 'role': {m!r}")
        content = m.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else _as_list(content)
        texts = []
        for p in parts:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                texts.append(str(p.get("text") or ""))
            elif kind in ("image", "image_url"):
                texts.append(IMAGE_MARK)
        if m["role"] == "system":
            system = "".join(texts)
        elif m["role"] == "user":
            user.append("".join(texts))
    if not user:
        raise RowError(f"'{field}' has no user message")
    return system, "\n".join(user)


def trl(row: dict) -> dict:
    if "prompt" not in row:
        raise RowError(f"TRL rows need 'prompt' messages; columns are {sorted(row)}")
    system, prompt = _messages(row["prompt"], "prompt")
    out = {k: v for k, v in row.items() if k not in ("prompt", "image", "images", "solution")}
    out["prompt"] = prompt
    out["images"] = _as_list(row.get("images", row.get("image")))
    if "answer" not in out and "solution" in row:
        out["answer"] = row["solution"]
    if system is not None:
        out["system"] = system
    return out


def verl(row: dict) -> dict:
    if "prompt" not in row or "reward_model" not in row:
        raise RowError(f"veRL rows need 'prompt' and 'reward_model'; columns are {sorted(row)}")
    system, prompt = _messages(row["prompt"], "prompt")
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise RowError("veRL 'reward_model' must be a mapping with 'ground_truth'")
    out = {k: v for k, v in row.items() if k not in ("prompt", "images", "image", "reward_model")}
    out.update(prompt=prompt, images=_as_list(row.get("images", row.get("image"))),
               answer=reward_model["ground_truth"])
    if system is not None:
        out["system"] = system
    return out


CONVERTERS: Registry = Registry("dataset format", references=True)
CONVERTERS.update({"mmrl": mmrl, "easyr1": easyr1, "trl": trl, "verl": verl})


def detect(row: dict) -> str:
    """The converter name that fits a row's columns."""
    if "reward_model" in row and "prompt" in row:
        return "verl"
    if isinstance(row.get("prompt"), (list, tuple)):
        return "trl"
    if "problem" in row and "prompt" not in row:
        return "easyr1"
    return "mmrl"


def converter(name: str):
    """A converter by format name (`auto` is resolved per row by `detect`), or a user converter
    'module:fn' / 'file.py:fn' taking a row and returning an mmrl record."""
    return CONVERTERS.resolve(name)
