"""Text verifiers for VLM completions: format, math, choice, numeric, exact, contains, overlong.

Every reward takes `list[Sample]` and returns one score per sample. A score of None means
"cannot be scored" (the output is not a `str`, or the reference answer is missing or
unusable); a wrong or unparsable *prediction* scores 0.0. Bad config kwargs raise ValueError.
"""

from __future__ import annotations

import functools
import math
import re
import threading

from rewards.registry import register

R1_FORMAT = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"  # DeepSeek-R1 prompt format
MATH_TIMEOUT_S = 5  # math-verify's default, used on the main thread only


def extract_answer(text: str, tag: str = "answer") -> str:
    """Content of the last `<tag>...</tag>` in `text`, stripped; the whole text stripped if none."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return (found[-1] if found else text).strip()


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern, flags=re.DOTALL)
    except re.error as e:
        raise ValueError(f"format reward: invalid regex pattern {pattern!r}: {e}") from e


@register("format")
def format_reward(samples: list, pattern: str = R1_FORMAT) -> list[float | None]:
    """1.0 if the whole output matches `pattern` (DOTALL; default R1 think/answer), else 0.0; None if not str."""
    rx = _compile(pattern)
    return [None if not isinstance(s.output, str) else float(rx.fullmatch(s.output) is not None)
            for s in samples]


# ---------------------------------------------------------------- math (math-verify)

def _timeout() -> int | None:
    """math-verify's timeouts use signal.alarm, which raises off the main thread: there, none (None)."""
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse_math(text: str) -> list:
    """math-verify parse; bare expressions are tried inside `$...$` first ("x^2+1" -> x**2 + 1)."""
    from math_verify import parse

    text = text.strip()
    if any(d in text for d in ("$", "\\(", "\\[", "\\boxed")):
        return parse(text, parsing_timeout=_timeout())
    return parse(f"${text}$", parsing_timeout=_timeout()) or parse(text, parsing_timeout=_timeout())


def _math_one(sample, tag: str) -> float | None:
    from math_verify import verify

    if not isinstance(sample.output, str) or sample.answer is None:
        return None
    gold = _parse_math(str(sample.answer))
    if not gold:
        return None
    pred = _parse_math(extract_answer(sample.output, tag))
    return float(bool(pred) and verify(gold, pred, timeout_seconds=_timeout()))


@register("math")
def math_reward(samples: list, tag: str = "answer") -> list[float | None]:
    """1.0 if math-verify finds the answer equivalent to `sample.answer`, else 0.0; None if no gold / not str.

    Timeouts: math-verify's 5 s on the main thread; none in worker threads (signal.alarm cannot run there).
    """
    return [_math_one(s, tag) for s in samples]


# ---------------------------------------------------------------- multiple choice

def _norm(text: str) -> str:
    return " ".join(str(text).split()).strip(" .").casefold()


def _options(meta: dict) -> dict[str, str]:
    """`meta["options"]` as {letter: text}; a list is lettered A, B, C, ..."""
    opts = meta.get("options")
    if isinstance(opts, dict):
        return {str(k).strip().upper(): str(v) for k, v in opts.items()}
    if isinstance(opts, (list, tuple)):
        return {chr(ord("A") + i): str(v) for i, v in enumerate(opts[:26])}
    return {}


def extract_choice(text: str, options: dict[str, str] | None = None) -> str | None:
    """A letter A-Z from an answer: "B", "(B)", "B.", "B) text", "The answer is B"; else option text."""
    text = text.strip()
    patterns = (r"^\(?([A-Z])\)?[.:)]?$",                   # B / (B) / B. / B)
                r"(?i:answer)\s*(?:is|:)?\s*\(?([A-Z])\b",  # The answer is B / Answer: (B)
                r"\(([A-Z])\)",                             # ... (B) ...
                r"^([A-Z])[.:)]\s")                         # B. Paris
    for pat in patterns:
        found = re.findall(pat, text)
        if found:
            return found[-1]
    for letter, option in (options or {}).items():
        if _norm(text) == _norm(option):
            return letter
    return None


def _gold_letter(answer, options: dict[str, str]) -> str | None:
    if isinstance(answer, str) and re.fullmatch(r"\s*\(?[A-Za-z]\)?\s*", answer):
        return answer.strip(" ()").upper()
    matches = [k for k, v in options.items() if answer is not None and _norm(v) == _norm(answer)]
    return matches[0] if matches else None


@register("choice")
def choice(samples: list, tag: str = "answer") -> list[float | None]:
    """1.0 if the chosen letter equals the gold letter (or gold option text in meta["options"]), else 0.0.

    None if the output is not str or the gold cannot be turned into a letter.
    """
    scores = []
    for s in samples:
        options = _options(s.meta)
        gold = _gold_letter(s.answer, options)
        if not isinstance(s.output, str) or gold is None:
            scores.append(None)
            continue
        scores.append(float(extract_choice(extract_answer(s.output, tag), options) == gold))
    return scores


# ---------------------------------------------------------------- numbers and strings

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*(?:\d+\.?\d*|\.\d+))?")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def parse_number(text) -> float | None:
    """The last number in `text` ("1,000", "-2.5e3", "3/4", "3/1.5" allowed); None if there is none,
    if it divides by zero, or if it is not finite (inf, nan, "1e999")."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _finite(float(text))
    found = _NUMBER.findall(str(text))
    if not found:
        return None
    num, _, den = found[-1].replace(",", "").replace(" ", "").partition("/")
    if not den:
        return _finite(float(num))
    return _finite(float(num) / float(den)) if float(den) != 0 else None


@register("numeric")
def numeric(samples: list, rel_tol: float = 1e-6, abs_tol: float = 1e-9, tag: str = "answer") -> list[float | None]:
    """1.0 if the answer's last number y has |y - gold| <= max(rel_tol * |gold|, abs_tol), else 0.0.

    None if the output is not str or the gold has no usable number (none, 1/0, inf: see `parse_number`).
    """
    if not (rel_tol >= 0 and abs_tol >= 0):
        raise ValueError(f"numeric reward: rel_tol and abs_tol must be >= 0, got {rel_tol}, {abs_tol}")
    scores = []
    for s in samples:
        gold = parse_number(s.answer) if s.answer is not None else None
        if not isinstance(s.output, str) or gold is None:
            scores.append(None)
            continue
        pred = parse_number(extract_answer(s.output, tag))
        scores.append(float(pred is not None and abs(pred - gold) <= max(rel_tol * abs(gold), abs_tol)))
    return scores


def _golds(answer) -> list[str] | None:
    """Gold strings: one, or any of a list/tuple; None if there is no gold."""
    if answer is None:
        return None
    return [str(a) for a in answer] if isinstance(answer, (list, tuple)) else [str(answer)]


def _canon(text: str, casefold: bool) -> str:
    text = " ".join(text.split())
    return text.casefold() if casefold else text


@register("exact")
def exact(samples: list, casefold: bool = True, tag: str = "answer") -> list[float | None]:
    """1.0 if the extracted answer equals a gold string (whitespace-normalised, optional casefold), else 0.0."""
    scores = []
    for s in samples:
        golds = _golds(s.answer)
        if not isinstance(s.output, str) or not golds:
            scores.append(None)
            continue
        pred = _canon(extract_answer(s.output, tag), casefold)
        scores.append(float(any(pred == _canon(g, casefold) for g in golds)))
    return scores


@register("contains")
def contains(samples: list, casefold: bool = True) -> list[float | None]:
    """1.0 if a (non-empty) gold string occurs anywhere in the whole output, else 0.0; None if no gold / not str."""
    scores = []
    for s in samples:
        golds = [g for g in _golds(s.answer) or [] if g.strip()]
        if not isinstance(s.output, str) or not golds:
            scores.append(None)
            continue
        out = _canon(s.output, casefold)
        scores.append(float(any(_canon(g, casefold) in out for g in golds)))
    return scores


# ---------------------------------------------------------------- DAPO overlong shaping

def _length(sample) -> int | None:
    """`meta["num_tokens"]` (the policy's token count) if present, else whitespace tokens of a str output."""
    if "num_tokens" in sample.meta:
        return int(sample.meta["num_tokens"])
    return len(sample.output.split()) if isinstance(sample.output, str) else None


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO (arXiv 2503.14476): 0 if |y| <= L-C; ((L-C)-|y|)/C in the buffer; -1 beyond L."""
    if length <= max_length - buffer:
        return 0.0
    if length <= max_length:
        return ((max_length - buffer) - length) / buffer
    return -1.0


@register("overlong")
def overlong(samples: list, max_length: int | None = None, buffer: int | None = None) -> list[float | None]:
    """DAPO soft overlong penalty in [-1, 0]; length from meta["num_tokens"] else whitespace tokens.

    None if the output is not str and there is no meta["num_tokens"].
    """
    if not isinstance(max_length, int) or not isinstance(buffer, int) or not 0 < buffer <= max_length:
        raise ValueError("overlong reward needs integers max_length (L) and buffer (C) with 0 < C <= L, "
                         f"got max_length={max_length!r}, buffer={buffer!r}")
    lengths = [_length(s) for s in samples]
    return [None if n is None else overlong_penalty(n, max_length, buffer) for n in lengths]
