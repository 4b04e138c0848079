"""Tokenizers and chat templates that match llama.cpp's, built from GGUF metadata.

tok = load_tokenizer(gguf_file)          # BPETokenizer (gpt2) or SPMTokenizer (llama)
ids = tok.encode("Hello", add_special=True, parse_special=False)
text = tok.decode(ids)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import TokenizerError
from ..metadata import meta_str
from .base import K, TokenAttr, Tokenizer
from .bpe import PRE_TOKENIZERS, BPETokenizer
from .detokenizer import StreamingDetokenizer
from .spm import SPMTokenizer

__all__ = [
    "BPETokenizer",
    "PRE_TOKENIZERS",
    "SPMTokenizer",
    "StreamingDetokenizer",
    "TokenAttr",
    "Tokenizer",
    "load_tokenizer",
]

TOKENIZER_MODELS = {"gpt2": BPETokenizer, "gemma4": BPETokenizer, "llama": SPMTokenizer}


def load_tokenizer(gguf_file: Any) -> Tokenizer:
    """The tokenizer described by a GGUF's `tokenizer.ggml.*` metadata.

    `gguf_file` is a GGUFFile, a path to one, or a metadata mapping.

    Raises:
        TokenizerError: no vocabulary, or a tokenizer model / pre-tokenizer we do not implement.
    """
    if isinstance(gguf_file, (str, os.PathLike)):
        from ..gguf_file import GGUFFile

        gguf_file = GGUFFile(gguf_file)
    meta = gguf_file if isinstance(gguf_file, Mapping) else gguf_file.metadata
    model = meta_str(meta, K.MODEL, None)
    if model is None:
        raise TokenizerError(f"the model has no tokenizer ('{K.MODEL}' is missing)")
    cls = TOKENIZER_MODELS.get(model)
    if cls is None:
        raise TokenizerError(
            f"unsupported tokenizer model '{model}' (supported: {', '.join(TOKENIZER_MODELS)})"
        )
    return cls(meta)
