"""Where a judge's vision-language model runs: in process (transformers) or behind an OpenAI-compatible
chat endpoint (such as `vllm serve`). Both take conversations of one user turn, images then the
rubric text, and return the model's reply text per conversation (None where a request failed).
"""

from __future__ import annotations

import base64
import io
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from rewards.models import align_weights

log = logging.getLogger("mmrl.rewards")


class LocalVLM:
    """A transformers image-text-to-text model loaded once; greedy replies, `batch_size` at a time. The default,
    one conversation per call, makes each reply independent of the others asked in the same step and of how the
    step is split over processes; a larger batch left-pads to its longest conversation, so a reply can differ
    in its last bits from the same question asked alone (throughput traded for exactness)."""

    def __init__(self, model: str, device: str = "cpu", dtype: str = "float32", max_new_tokens: int = 16,
                 batch_size: int = 1):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        if dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype!r}")
        self.processor = AutoProcessor.from_pretrained(model)
        self.processor.tokenizer.padding_side = "left"
        self.model = AutoModelForImageTextToText.from_pretrained(model, dtype=getattr(torch, dtype))
        align_weights(self.model.to(device).eval().requires_grad_(False))
        self.device, self.max_new_tokens, self.batch_size = device, max_new_tokens, batch_size

    def reply(self, conversations: list[tuple[list, str]]) -> list[str | None]:
        """(images, text) per conversation -> the model's greedy reply."""
        out = []
        for lo in range(0, len(conversations), self.batch_size):
            out += self._batch(conversations[lo:lo + self.batch_size])
        return out

    def _batch(self, conversations: list[tuple[list, str]]) -> list[str]:
        import torch

        texts = [self.processor.apply_chat_template(
            [{"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": text}]}],
            tokenize=False, add_generation_prompt=True) for images, text in conversations]
        images = [list(images) for images, _ in conversations]
        inputs = self.processor(text=texts, images=images if any(images) else None, padding=True,
                                return_tensors="pt").to(self.device)
        with torch.no_grad():
            ids = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        new = ids[:, inputs["input_ids"].shape[1]:]                         # [B, new tokens]
        return self.processor.batch_decode(new, skip_special_tokens=True)


def data_url(image) -> str:
    """A PIL image as a PNG data URL (how OpenAI-compatible chat APIs take images)."""
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class ChatEndpoint:
    """POST {url}/chat/completions per conversation (temperature 0), `max_concurrency` at a time, with
    `retries` retries and exponential backoff on connection errors, timeouts and 5xx replies."""

    def __init__(self, url: str, api_model: str = "", api_key: str | None = None, max_new_tokens: int = 16,
                 request_timeout_s: float = 60.0, retries: int = 2, max_concurrency: int = 4):
        try:
            import httpx
        except ImportError:
            raise ImportError("a judge with url needs httpx: pip install 'mmrl[serve]'") from None

        self.url = url.rstrip("/") + "/chat/completions"
        self.api_model, self.max_new_tokens, self.retries = api_model, max_new_tokens, retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=request_timeout_s, headers=headers)
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="mmrl-judge")
        self._logged = False

    def body(self, images: list, text: str) -> dict:
        content = [*({"type": "image_url", "image_url": {"url": data_url(im)}} for im in images),
                   {"type": "text", "text": text}]
        return {"model": self.api_model, "messages": [{"role": "user", "content": content}],
                "temperature": 0, "max_tokens": self.max_new_tokens}

    def reply(self, conversations: list[tuple[list, str]]) -> list[str | None]:
        replies = list(self.pool.map(lambda c: self._ask(*c), conversations))
        if conversations and all(r is None for r in replies):
            raise RuntimeError(f"judge endpoint {self.url}: every request failed (see the warning above)")
        return replies

    def _ask(self, images: list, text: str) -> str | None:
        import httpx

        for attempt in range(self.retries + 1):
            try:
                r = self.client.post(self.url, json=self.body(images, text))
                if r.status_code < 500:
                    r.raise_for_status()                                    # 4xx: not retried
                    return r.json()["choices"][0]["message"]["content"]
                err = f"HTTP {r.status_code}: {r.text[:200]}"
            except (httpx.TransportError, httpx.TimeoutException) as e:
                err = f"{type(e).__name__}: {e}"
            except (httpx.HTTPStatusError, KeyError, IndexError, ValueError) as e:
                self._warn(f"judge endpoint {self.url}: {type(e).__name__}: {e}")
                return None
            if attempt < self.retries:
                time.sleep(0.5 * 2 ** attempt)
        self._warn(f"judge endpoint {self.url}: {err} (after {self.retries + 1} attempts)")
        return None

    def _warn(self, message: str) -> None:
        if not self._logged:
            self._logged = True
            log.warning("%s (further failures of this judge are counted, not logged)", message)
