"""A chat held in one context, as llama.cpp's chat holds it: each new message adds only the text the chat template
puts after what the context already holds (the template's rendering of the conversation so far, the last reply as
it was generated), so a turn costs its own tokens, not the whole conversation's."""

from __future__ import annotations

from typing import Any, Callable

from graphir.running.chat import ChatTemplate
from graphir.running.generation import Generation


class Conversation:
    def __init__(self, generation: Generation, template: ChatTemplate, system: str | None = None):
        self.generation, self.template = generation, template
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.held = ""  # the rendered text the context holds, up to the end of the last reply

    def ask(self, text: str, feed: Callable[[list[int]], Any]) -> None:
        """Add the user's message and decode what it adds (through ``feed``, which decodes tokens into the
        generation). Whatever stops the feed (Ctrl-C, a full context) leaves the conversation as it was."""
        g = self.generation
        rendered = self.template.render([*self.messages, {"role": "user", "content": text}])
        if not rendered.startswith(self.held):  # the template rewrote what was said before: hold it anew
            self._forget()
        delta = rendered[len(self.held):]
        ids = g.model.tokenize(delta, add_special=False, parse_special=True)  # the template places BOS itself
        before = (len(g.tokens), list(g.pending), g.shifts)
        try:
            feed(ids)
        except BaseException:
            n, pending, shifts = before
            if g.shifts != shifts:  # what was shifted out is gone: the next message brings the whole conversation
                self._forget()
            else:
                g.ctx.memory.seq_rm(0, n, -1)
                del g.tokens[n:]
                g.pending = pending
            raise
        self.messages.append({"role": "user", "content": text})
        self.held = rendered

    def answer(self, reply: str) -> None:
        """The assistant's reply (as generated, whole or cut short) joins the conversation."""
        self.messages.append({"role": "assistant", "content": reply})
        self.held += reply

    def _forget(self) -> None:
        g = self.generation
        g.ctx.memory.seq_rm(0, -1, -1)
        g.tokens, g.pending, self.held = [], [], ""
