"""The sentences of an answer as its tokens arrive: TTS starts on the first complete one
while the LLM goes on. A sentence ends at `.`, `!`, `?` or `…` followed by white space (so
"3.5" and "e.g.x" do not end one), or at a line break; a piece with fewer than
`min_chars` characters waits for the next (an abbreviation such as "Dr." alone is no
sentence to speak)."""

from __future__ import annotations

import re

BOUNDARY = re.compile(r"[.!?…]+[\"')\]]*\s+|\n+")


class Sentences:
    def __init__(self, min_chars: int = 12) -> None:
        self.min_chars = min_chars
        self._pending = ""

    def push(self, text: str) -> list[str]:
        """The sentences that `text` completed, in order."""
        self._pending += text
        done: list[str] = []
        start = 0
        for match in BOUNDARY.finditer(self._pending):
            piece = self._pending[start : match.end()]
            if len(piece.strip()) >= self.min_chars:
                done.append(piece.strip())
                start = match.end()
        self._pending = self._pending[start:]
        return done

    def flush(self) -> str | None:
        """What is left once the answer has ended (None: nothing)."""
        rest, self._pending = self._pending.strip(), ""
        return rest or None


def speakable(text: str) -> bool:
    """Whether TTS has anything to say in `text` (a letter or a digit)."""
    return any(ch.isalnum() for ch in text)
