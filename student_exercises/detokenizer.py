# Generated from reference/detokenizer.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Incremental detokenization for streaming return (stage 6).

Byte-level BPE tokens can split a multi-byte UTF-8 character (one Chinese
character is often two or three tokens). Decoding the tokens received so far
then ends in U+FFFD; that tail is held back until the rest of the character
arrives, so a client never sees a replacement character that later turns into
a real one. Shared by `LLM.stream` and the HTTP server's SSE stream.

Each push decodes only a short window (the tokens since the last text that was
sent, plus the few before them for context), not the whole output again:
decoding everything on every token makes a 1,000-token answer cost half a
million token decodes, on the serving hot path.
"""
from __future__ import annotations

REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's tokens, as they arrive, into text deltas.

    `prefix_offset..read_offset` are tokens already turned into sent text; they
    are decoded again only as context, so that a tokenizer whose decoding of a
    token depends on its left neighbour (leading-space rules) gives the same
    text as decoding the whole sequence.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, new_token_ids: list[int], finished: bool) -> str:
        """Add tokens; return the text that is now safe to send (may be empty)."""
        self.token_ids += new_token_ids
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.token_ids[self.prefix_offset:])
        if text.endswith(REPLACEMENT_CHARACTER) and not finished:
            return ""   # wait for the rest of the character
        delta = text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return delta
