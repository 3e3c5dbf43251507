"""The simulated engines' wire format: chunks, usage and errors in vLLM's or SGLang's
spelling."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

__all__ = ["Wire", "DONE"]


def _now() -> int:
    return int(time.time())


class Wire:
    """Chunks in one engine's spelling."""

    def __init__(self, profile: str, model: str, chat: bool) -> None:
        self.vllm = profile == "vllm"
        self.model = model
        self.chat = chat
        prefix = ("chatcmpl-" if chat else "cmpl-") if self.vllm else ""
        self.id = prefix + uuid.uuid4().hex
        self.created = _now()
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        doc: dict[str, Any] = {"id": self.id, "object": self.object, "created": self.created,
                               "model": self.model, "choices": choices}
        if not self.vllm and "usage" not in extra:
            doc["usage"] = None
        doc.update(extra)
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        stop_key = "stop_reason" if self.vllm else "matched_stop"
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish, stop_key: None}
        if self.vllm:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            if not role and text is None:
                delta = {}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        delta = {"role": "assistant" if role else None, "content": "" if role else text,
                 "reasoning_content": None, "tool_calls": None}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}

    def role(self) -> bytes:
        return self._chunk([self._choice(None, None, role=True)])

    def token(self, text: str, finish: str | None = None) -> bytes:
        return self._chunk([self._choice(text, finish)])

    def finish(self) -> bytes:
        return self._chunk([self._choice(None, "length")])

    def usage(self, prompt: int, completion: int) -> bytes:
        return self._chunk([], usage={"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                      "completion_tokens": completion})

    def error(self) -> bytes:
        if self.vllm:
            err: dict[str, Any] = {"message": "Internal server error", "type": "InternalServerError",
                                   "param": None, "code": 500}
        else:
            err = {"object": "error", "message": "simulated scheduler error", "type": "BadRequestError",
                   "param": None, "code": 400}
        return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"

    def document(self, text: str, prompt: int, completion: int) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                          "completion_tokens": completion}}


DONE = b"data: [DONE]\n\n"
