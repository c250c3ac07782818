"""A model's chat template: the GGUF's ``tokenizer.chat_template`` rendered with jinja2, as the Python ecosystem
(transformers, llama-cpp-python) renders it: a sandbox, blocks trimmed, ``messages``, ``add_generation_prompt``,
``bos_token`` and ``eos_token`` given, ``raise_exception`` and ``strftime_now`` callable from the template."""

from __future__ import annotations

import datetime
import json
from typing import Any, Mapping, Sequence

from graphir.errors import GraphirError

Message = Mapping[str, Any]  # {"role": "user", "content": "..."}


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", label: str = "chat template"):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                        ensure_ascii=ensure_ascii)
        env.globals.update(raise_exception=self._raise, strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise GraphirError(f"{label}: not a jinja2 template ({e})") from None
        self.bos_token, self.eos_token, self.label = bos_token, eos_token, label

    def _raise(self, message: str) -> None:
        raise GraphirError(f"{self.label}: {message}")

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The conversation as the text the model was trained on, ending where the assistant's reply begins."""
        import jinja2

        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
                raise GraphirError(f"message {i} must be a mapping with 'role' and 'content', got {m!r}")
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as e:
            raise GraphirError(f"{self.label}: cannot render the conversation ({e})") from None
