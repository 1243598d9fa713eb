"""Incremental detokenization for streaming return (stage 6).

Byte-level BPE tokens can split a multi-byte UTF-8 character (one Chinese
character is often two or three tokens). Decoding the tokens received so far
then ends in U+FFFD; that tail is held back until the rest of the character
arrives, so a client never sees a replacement character that later turns into
a real one. Shared by `LLM.stream` and the HTTP server's SSE stream.
"""
from __future__ import annotations

REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's tokens, as they arrive, into text deltas."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.sent_text = ""

    def push(self, new_token_ids: list[int], finished: bool) -> str:
        """Add tokens; return the text that is now safe to send (may be empty)."""
        self.token_ids += new_token_ids
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if text.endswith(REPLACEMENT_CHARACTER) and not finished:
            return ""   # wait for the rest of the character
        delta = text[len(self.sent_text):]
        self.sent_text = text
        return delta
