"""The simulated engines' wire format: chunks, usage and errors in vLLM's or SGLang's
spelling."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["Wire", "DONE", "usage_doc", "tool_arguments", "request_metrics", "spec_steps", "SpecCounts", "TIMING_KEYS"]


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

    def tool(self, i: int, n: int, name: str, finish: str | None = None) -> bytes:
        """Token ``i`` of ``n`` of a tool call: the first names the function, each adds one token of
        its JSON arguments (``{"query": "tok0 tok1 ..."}``)."""
        call: dict[str, Any] = {"index": 0, "function": {"arguments": tool_arguments(i, n)}}
        if i == 0:
            call = {"id": f"call-{self.id[-12:]}", "type": "function", "index": 0,
                    "function": {"name": name, "arguments": call["function"]["arguments"]}}
        delta: dict[str, Any] = {"tool_calls": [call]}
        if not self.vllm:
            delta = {"role": None, "content": None, "reasoning_content": None, **delta}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if not self.vllm:
            choice["matched_stop"] = None
        return self._chunk([choice])

    def role(self) -> bytes:
        return self._chunk([self._choice(None, None, role=True)])

    def token(self, text: str, finish: str | None = None, ids: list[int] | None = None) -> bytes:
        """One token's chunk; with ``ids`` (the client asked ``return_token_ids``) its token ids."""
        choice = self._choice(text, finish)
        if ids is not None:
            choice["token_ids"] = ids
        return self._chunk([choice])

    def finish(self, reason: str = "length") -> bytes:
        return self._chunk([self._choice(None, reason)])

    def usage(self, prompt: int, completion: int, cached: int | None = None,
              metrics: dict[str, Any] | None = None) -> bytes:
        """The usage chunk; with ``metrics`` (vLLM's per-request metrics object) beside the usage."""
        return self._chunk([], usage=usage_doc(prompt, completion, cached), **({"metrics": metrics} if metrics else {}))

    def spec_details(self, spec: SpecCounts) -> bytes:
        """SGLang's speculative-decoding chunk (asked ``return_spec_tokens_details: true``): no choices,
        ``sglext.spec_tokens_details`` with the request's drafted and accepted tokens and its verify steps."""
        return self._chunk([], sglext={"spec_tokens_details": {
            "spec_num_proposed_drafts": spec.drafts, "spec_num_correct_drafts": spec.accepted,
            "spec_verify_ct": spec.steps}})

    def error(self) -> bytes:
        if self.vllm:
            err: dict[str, Any] = {"message": "Internal server error", "type": "InternalServerError",
                                   "param": None, "code": 500}
        else:
            err = {"object": "error", "message": "simulated scheduler error", "type": "BadRequestError",
                   "param": None, "code": 400}
        return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"

    def document(self, text: str, prompt: int, completion: int, cached: int | None = None,
                 tool: str | None = None) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool is not None:
                args = "".join(tool_arguments(i, completion) for i in range(completion))
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"call-{self.id[-12:]}", "type": "function", "function": {"name": tool, "arguments": args}}]}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": "length" if tool is None else "tool_calls"}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage_doc(prompt, completion, cached)}


def usage_doc(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """The usage object; ``prompt_tokens_details.cached_tokens`` where the engine keeps a prefix cache."""
    doc: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                           "completion_tokens": completion}
    if cached is not None:
        doc["prompt_tokens_details"] = {"cached_tokens": cached}
    return doc


#: the timing members of vLLM's per-request ``metrics`` object
TIMING_KEYS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second")


def request_metrics(queue_s: float, prefill_s: float, generation_s: float, tokens: int) -> dict[str, Any]:
    """vLLM's per-request ``metrics`` object (``--enable-per-request-metrics``) from the simulated
    clock: queued to scheduled, scheduled to the first token, first to last token (ms), as vLLM
    derives them from its own stamps."""
    inference_s = prefill_s + generation_s
    return {"time_to_first_token_ms": prefill_s * 1000, "generation_time_ms": generation_s * 1000,
            "queue_time_ms": queue_s * 1000,
            "mean_itl_ms": generation_s / (tokens - 1) * 1000 if tokens > 1 else None,
            "tokens_per_second": tokens / inference_s if inference_s > 0 else None}


@dataclass(frozen=True, slots=True)
class SpecCounts:
    """One request's speculative decoding: verify steps, drafted tokens, accepted drafted tokens; ``k``
    tokens drafted a step, ``histogram[j]`` the steps that accepted ``j`` of them."""

    steps: int
    drafts: int
    accepted: int
    k: int = 0
    histogram: tuple[int, ...] = ()

    def vllm(self) -> dict[str, Any]:
        """vLLM's ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics summary``)."""
        return {"mean_acceptance_length": 1 + self.accepted / self.steps if self.steps else 1.0,
                "draft_acceptance_rate": self.accepted / self.drafts if self.drafts else 0.0,
                "acceptance_histogram": list(self.histogram), "num_spec_steps": self.steps,
                "num_accepted_draft_tokens": self.accepted, "num_draft_tokens": self.drafts, "num_spec_tokens": self.k}


def spec_steps(n: int, k: int, accept: float) -> tuple[list[int], SpecCounts | None]:
    """Tokens per decode step of an ``n``-token answer: with ``k`` > 0 drafted tokens a step, each step
    accepts ``round(k * accept)`` of them (fewer at the end) and adds its own token, so one event
    carries several tokens; ``k`` = 0: one token a step and no counts."""
    if k <= 0:
        return [1] * n, None
    per_step = 1 + min(k, max(0, round(k * accept)))
    sizes = [per_step] * (n // per_step) + ([n % per_step] if n % per_step else [])
    histogram = [0] * (k + 1)
    for size in sizes:
        histogram[size - 1] += 1
    return sizes, SpecCounts(len(sizes), k * len(sizes), n - len(sizes), k, tuple(histogram))


def tool_arguments(i: int, n: int) -> str:
    """Token ``i`` of ``n`` of a tool call's arguments: together ``{"query": "tok0 ... tok{n-1}"}``."""
    part = f"tok{i}" if i == 0 else f" tok{i}"
    return ('{"query": "' if i == 0 else "") + part + ('"}' if i == n - 1 else "")


DONE = b"data: [DONE]\n\n"
