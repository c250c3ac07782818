"""The OpenAI request bodies the server takes, checked field by field before anything runs: a field of the wrong
type or out of range, an unknown field, or one graphir does not do is a 400 naming it (OpenAI's error body).

Each endpoint's fields are a table (name: type, range, default) rather than code, so the checks and the error
messages are the same everywhere.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from graphir.running.sampling import Sampling

MAX_TOP_LOGPROBS = 20  # OpenAI's bound


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx/5xx), the message, and the field it is about."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _ids(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(_integer(t) for t in v)


def _prompt(v: Any) -> bool:
    """A text, texts, token ids, or lists of token ids (OpenAI's four forms of ``prompt`` and ``input``)."""
    return (isinstance(v, str) or _ids(v)
            or (isinstance(v, list) and len(v) > 0 and (all(isinstance(s, str) for s in v) or all(_ids(s) for s in v))))


@dataclass(frozen=True)
class Field:
    valid: Callable[[Any], bool]
    expected: str
    default: Any = None
    supported: Callable[[Any], bool] | None = None  # a value graphir takes; else the field is refused as unsupported


def _between(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: _number(v) and low <= v <= high


def _whole(low: int, high: int | None = None) -> Callable[[Any], bool]:
    return lambda v: _integer(v) and v >= low and (high is None or v <= high)


SAMPLING = {
    "model": Field(lambda v: isinstance(v, str), "a string"),
    "max_tokens": Field(_whole(1), "an integer >= 1"),
    "max_completion_tokens": Field(_whole(1), "an integer >= 1"),
    "temperature": Field(_between(0, 2), "a number in [0, 2]", 1.0),
    "top_p": Field(lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]", 1.0),
    "top_k": Field(_whole(0), "an integer >= 0 (0: every token)", 0),
    "min_p": Field(_between(0, 1), "a number in [0, 1]", 0.0),
    "repeat_penalty": Field(lambda v: _number(v) and v > 0, "a number > 0", 1.0),
    "seed": Field(_integer, "an integer"),
    "stop": Field(lambda v: _strings(v) and (isinstance(v, str) or len(v) <= 16), "a string or up to 16 strings"),
    "stream": Field(lambda v: isinstance(v, bool), "true or false", False),
    "stream_options": Field(lambda v: isinstance(v, dict) and set(v) <= {"include_usage"}
                            and isinstance(v.get("include_usage", False), bool), '{"include_usage": true|false}'),
    "n": Field(_whole(1), "an integer >= 1", 1, lambda v: v == 1),
    "presence_penalty": Field(_between(-2, 2), "a number in [-2, 2]", 0, lambda v: v == 0),
    "frequency_penalty": Field(_between(-2, 2), "a number in [-2, 2]", 0, lambda v: v == 0),
    "logit_bias": Field(lambda v: isinstance(v, dict), "an object", None, lambda v: not v),
    "user": Field(lambda v: isinstance(v, str), "a string"),
    "ignore_eos": Field(lambda v: isinstance(v, bool), "true or false", False),  # llama-server's: generate on
}

CHAT = {
    **SAMPLING,
    "messages": Field(lambda v: isinstance(v, list), "a list of messages"),
    "logprobs": Field(lambda v: isinstance(v, bool), "true or false", False),
    "top_logprobs": Field(_whole(0, MAX_TOP_LOGPROBS), f"an integer in [0, {MAX_TOP_LOGPROBS}]", 0),
    "response_format": Field(lambda v: isinstance(v, dict), "an object", None,
                             lambda v: v.get("type", "text") == "text"),
    "tools": Field(lambda v: isinstance(v, list), "a list", None, lambda v: not v),
    "tool_choice": Field(lambda v: isinstance(v, (str, dict)), "a string or an object", None,
                         lambda v: v == "none"),
}

COMPLETION = {
    **SAMPLING,
    "prompt": Field(_prompt, "a string, a list of strings, a list of token ids or a list of such lists"),
    "logprobs": Field(_whole(0, MAX_TOP_LOGPROBS), f"an integer in [0, {MAX_TOP_LOGPROBS}]"),
    "echo": Field(lambda v: isinstance(v, bool), "true or false", False),
    "suffix": Field(lambda v: isinstance(v, str), "a string", None, lambda v: not v),
    "best_of": Field(_whole(1), "an integer >= 1", 1, lambda v: v == 1),
}

EMBEDDING = {
    "model": SAMPLING["model"],
    "user": SAMPLING["user"],
    "input": Field(_prompt, "a string, a list of strings, a list of token ids or a list of such lists"),
    "encoding_format": Field(lambda v: v in ("float", "base64"), '"float" or "base64"', "float"),
    "dimensions": Field(_whole(1), "an integer >= 1", None, lambda v: False),  # the model's width only
}


def parse(raw: bytes, fields: dict[str, Field], required: tuple[str, ...]) -> dict[str, Any]:
    """The request's fields, every one checked against ``fields``; defaults filled in."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}", unknown[0])
    for name in required:
        if body.get(name) is None:
            raise RequestError(f"{name!r} is required", name)
    out = {}
    for name, f in fields.items():
        v = body.get(name)
        if v is None:
            out[name] = f.default
            continue
        if not f.valid(v):
            raise RequestError(f"{name!r} must be {f.expected}, got {json.dumps(v)[:80]}", name)
        if f.supported is not None and not f.supported(v):
            raise RequestError(f"{name}={json.dumps(v)[:80]} is not supported by this server", name)
        out[name] = v
    return out


def sampling(req: dict[str, Any]) -> Sampling:
    """The sampler chain of a request (OpenAI's defaults: temperature 1, top_p 1, no top-k, no min-p)."""
    return Sampling(temperature=float(req["temperature"]), top_k=int(req["top_k"]), top_p=float(req["top_p"]),
                    min_p=float(req["min_p"]), repeat_penalty=float(req["repeat_penalty"]), seed=req["seed"])


def stops(req: dict[str, Any]) -> tuple[str, ...]:
    stop = req["stop"]
    return () if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)


def max_tokens(req: dict[str, Any]) -> int | None:
    return req["max_completion_tokens"] if req["max_completion_tokens"] is not None else req["max_tokens"]


def messages(req: dict[str, Any]) -> list[dict[str, str]]:
    """The chat's messages as the template takes them: a role and a text (OpenAI's text parts joined)."""
    out = []
    if not req["messages"]:
        raise RequestError("'messages' must hold at least one message", "messages")
    for i, m in enumerate(req["messages"]):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"{where} must be an object with a 'role' string", where)
        if m["role"] not in ("system", "developer", "user", "assistant"):
            raise RequestError(f"{where}: role {m['role']!r} is not one of system, developer, user, assistant", where)
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, p in enumerate(content):
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise RequestError(f"{where}.content[{j}]: only text parts are supported", where)
                parts.append(p["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"{where}.content must be a string or a list of text parts", where)
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


def texts_or_ids(value: Any) -> list[str | list[int]]:
    """OpenAI's ``prompt``/``input`` as a list of texts or token-id lists, one per prompt."""
    if isinstance(value, str) or _ids(value):
        return [value]
    return list(value)
