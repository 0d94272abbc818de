"""The text of a growing list of committed token ids, as a stream of deltas, cut at the first stop string.

Every update decodes the whole committed list (a byte-level BPE's text of a prefix is a prefix of the text, up
to an incomplete UTF-8 character at its end) and releases only text that cannot change: a trailing U+FFFD (an
incomplete character) and a tail that could still become a stop string are held back until the next update.
The concatenated deltas equal :attr:`TextStream.text` at the end, which is what a non-streamed response returns.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.ids: list[int] = []
        self.sent = ""  # text released so far
        self.text = ""  # the whole text, once finished or stopped
        self.stopped = False  # a stop string was found; ``text`` ends before it and ``ids`` is cut to match

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _find_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def update(self, committed: list[int]) -> str:
        """Add newly committed ids; the text delta that is safe to send now."""
        if self.stopped or not committed:
            return ""
        self.ids.extend(committed)
        text = self._decode(self.ids)
        cut = self._find_stop(text)
        if cut is not None:
            self._stop_at(text[:cut])
            return self._release(self.text)
        safe = text.rstrip(REPLACEMENT)
        hold = max((k for s in self.stop for k in range(1, len(s)) if safe.endswith(s[:k])), default=0)
        return self._release(safe[: len(safe) - hold])

    def finish(self) -> str:
        """The rest of the text once decoding has ended."""
        if not self.stopped:
            self.text = self._decode(self.ids)
        return self._release(self.text)

    def _stop_at(self, text: str) -> None:
        """Keep the shortest id prefix whose text reaches the stop string (the ids the response reports)."""
        self.stopped, self.text = True, text
        lo, hi = 0, len(self.ids)  # the text of ids[:hi] contains a stop string; find the least such hi
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if self._find_stop(self._decode(self.ids[:mid])) is not None:
                hi = mid
            else:
                lo = mid
        self.ids = self.ids[:hi]

    def _release(self, upto: str) -> str:
        if not upto.startswith(self.sent) or len(upto) <= len(self.sent):
            return ""
        delta = upto[len(self.sent) :]
        self.sent = upto
        return delta
