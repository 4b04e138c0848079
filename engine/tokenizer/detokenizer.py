"""StreamingDetokenizer: token ids in, text out, never half a UTF-8 character.

Byte-level BPE and byte-fallback SPM tokens can split one character over several tokens; the
incremental decoder holds back an incomplete sequence until the rest arrives, and replaces
bytes that can never become valid UTF-8 with U+FFFD.
"""

from __future__ import annotations

import codecs


class StreamingDetokenizer:
    """add(token_id) -> the newly complete text; flush() -> whatever is left (at the end).

    special=False (the default, like llama-server) renders control tokens such as
    <|im_end|> as nothing; special=True renders their text.
    """

    def __init__(self, tokenizer, special: bool = False):
        self._tok = tokenizer
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        piece = self._tok.token_to_piece(int(token_id), self._special)
        return self._decoder.decode(piece) if piece else ""

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text

    def reset(self) -> None:
        self._decoder.reset()
