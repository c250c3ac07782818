"""Stop strings over streamed text: a reply's text is shown as it comes, except a tail that could still turn out
to begin a stop string; when one appears, the reply ends just before it (OpenAI's ``stop``, llama-server's too)."""

from __future__ import annotations


class StopScan:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""   # the reply so far, cut at a stop string once one is found
        self.shown = 0   # how much of it has been handed out

    def add(self, piece: str) -> tuple[str, bool]:
        """Take the next piece of text: what may be shown now, and whether a stop string ended the reply."""
        self.text += piece
        found = [i for i in (self.text.find(s, self.shown) for s in self.stops) if i >= 0]
        if found:
            self.text = self.text[:min(found)]
            return self._show(len(self.text)), True
        held = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self._show(max(self.shown, len(self.text) - held)), False

    def flush(self) -> str:
        """The held tail, once no more text comes."""
        return self._show(len(self.text))

    def _show(self, end: int) -> str:
        out, self.shown = self.text[self.shown:end], end
        return out
