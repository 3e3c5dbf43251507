"""A request's prompt as the engine tokenizes it: the model's tokenizer, and for chat its chat template.

Used by the trace capture (:mod:`exporter.proxy.trace`) and the simulated engines' ``--tokenizer``;
it needs the ``trace`` extra (Hugging Face ``tokenizers``, ``jinja2``), imported only when a
tokenizer is configured, never by a proxy without one.

What the engines do, and what this does without the whole of ``transformers``:

- ``/v1/completions``: a string prompt is encoded with the tokenizer's special tokens
  (``add_special_tokens`` true: the ``tokenizer.json`` post-processor adds a BOS where the model
  has one); a prompt of token ids is taken as it is; a batch of several prompts is not traced.
- ``/v1/chat/completions``: the chat template (``chat_template.jinja`` beside ``tokenizer.json``,
  else ``tokenizer_config.json``'s ``chat_template``, the ``default`` one of a list) is rendered
  with jinja2 as ``transformers`` renders it (a sandboxed environment with ``trim_blocks``,
  ``lstrip_blocks`` and loop controls; ``tojson`` without ASCII escapes; ``raise_exception``,
  ``strftime_now``; ``{% generation %}`` blocks rendered as plain text), with ``messages``,
  ``tools``, ``documents``, ``add_generation_prompt`` (true unless the request says otherwise),
  ``continue_final_message``, the request's ``chat_template_kwargs`` and the special tokens of
  ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...); the text is then encoded without
  special tokens, as vLLM does for chat.  Message contents given as parts are joined with newlines
  (text parts only) unless the template loops over a message's content, where the parts are passed
  as they are (vLLM's two content formats); tool-call arguments are passed as objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["TokenizerError", "PromptTokenizer", "tokenizer_file"]

#: special-token keys of tokenizer_config.json given to the chat template, as transformers does
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: a template that loops over a message's content takes the parts, not one joined string
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+[\w.]*(?:\[\s*['\"]content['\"]\s*\]|\.content)\b")


class TokenizerError(Exception):
    """The tokenizer or its chat template cannot be used (one line for the user)."""


def tokenizer_file(path: Path) -> Path:
    """``tokenizer.json`` of a model directory, or the file itself."""
    return path / "tokenizer.json" if path.is_dir() else path


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_source(directory: Path, config: Mapping[str, Any]) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile(source: str) -> Callable[..., str]:
    """The template compiled as transformers compiles it (``_compile_jinja_template``)."""
    try:
        import jinja2
        from jinja2 import nodes
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TokenizerError("chat templates need jinja2: pip install 'llm-bench-exporter[trace]'") from None

    class Generation(Extension):  # {% generation %}...{% endgeneration %}: the text, unmarked
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source).render
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"the chat template does not compile: {exc}") from None


def _content(content: Any, as_parts: bool) -> Any:
    """A message's content as the template gets it (vLLM's ``string`` or ``openai`` format)."""
    if not isinstance(content, list):
        return content
    if as_parts:
        return [p if isinstance(p, Mapping) and p.get("type") == "text" else {"type": "image"} for p in content]
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")


def _message(msg: Any, as_parts: bool) -> Any:
    if not isinstance(msg, Mapping):
        return msg
    out = dict(msg)
    if "content" in out:
        out["content"] = _content(out["content"], as_parts)
    calls = out.get("tool_calls")
    if isinstance(calls, list):  # the templates expect the arguments as an object, not a JSON string
        out["tool_calls"] = [_with_object_arguments(c) for c in calls]
    return out


def _with_object_arguments(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("arguments"), str):
        return call
    try:
        arguments = json.loads(fn["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**fn, "arguments": arguments}}


class PromptTokenizer:
    """The model's tokenizer (``tokenizer.json``) and chat template, applied as the engine applies them."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError("a tokenizer needs the tokenizers package: "
                                 "pip install 'llm-bench-exporter[trace]'") from None
        file = tokenizer_file(Path(path))
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json at {path}")
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises its own exception types
            raise TokenizerError(f"cannot read {file}: {exc}") from None
        config = _read_json(file.parent / "tokenizer_config.json")
        self.special = {k: t for k in _NAMED_TOKENS if (t := _token_text(config.get(k))) is not None}
        source = _template_source(file.parent, config)
        self._render = _compile(source) if source is not None else None
        self._as_parts = source is not None and _LOOPS_OVER_CONTENT.search(source) is not None
        # encode_batch releases the GIL while it encodes (encode does not): the event loop runs on
        self._encode = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch

    @property
    def has_chat_template(self) -> bool:
        return self._render is not None

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self._encode([text], add_special_tokens=special)[0].ids)

    def chat_text(self, body: Mapping[str, Any]) -> str | None:
        """The chat request's messages rendered by the model's template; None without one."""
        messages = body.get("messages")
        if self._render is None or not isinstance(messages, list):
            return None
        extra = body.get("chat_template_kwargs")
        return self._render(
            messages=[_message(m, self._as_parts) for m in messages], tools=body.get("tools"),
            documents=body.get("documents"), add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            continue_final_message=body.get("continue_final_message") is True,
            **{**self.special, **(extra if isinstance(extra, Mapping) else {})})

    def prompt_ids(self, body: Mapping[str, Any], chat: bool) -> list[int] | None:
        """The prompt's token ids as the engine counts them; None when they cannot be told."""
        if chat:
            text = self.chat_text(body)
            return None if text is None else self.encode(text, body.get("add_special_tokens") is True)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return self.encode(prompt, body.get("add_special_tokens", True) is not False)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        return None
