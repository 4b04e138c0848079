"""Batch: the input of one Context.decode call, like llama_batch.

Each entry is a token at a position in a sequence, and says whether its logits are wanted.
One batch may mix sequences: a prompt chunk of one and single decode tokens of others.
Entries with a negative token take their input row from `embd` instead (image embeddings, as
llama_batch.embd); `attn_end`, when set, is the last position each entry attends to (an image
span whose tokens see each other, non-causally; llama_set_causal_attn(false) for the span).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # (n,) int32
    pos: np.ndarray  # (n,) int32
    seq_id: np.ndarray  # (n,) int32
    logits: np.ndarray  # (n,) bool: return logits (or embeddings) for this entry
    embd: np.ndarray | None = None  # (n, n_embd) float32: the input rows of negative tokens
    attn_end: np.ndarray | None = None  # (n,) int32: last position seen (default: pos)

    def __post_init__(self):
        n = len(self.tokens)
        for name, field in (("pos", self.pos), ("seq_id", self.seq_id), ("logits", self.logits)):
            if len(field) != n:
                raise ValueError(f"batch field '{name}' has {len(field)} entries, expected {n}")
        if self.embd is not None and len(self.embd) != n:
            raise ValueError(f"batch field 'embd' has {len(self.embd)} rows, expected {n}")
        if self.attn_end is not None and len(self.attn_end) != n:
            raise ValueError(
                f"batch field 'attn_end' has {len(self.attn_end)} entries, expected {n}"
            )

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return int(self.logits.sum())

    @classmethod
    def make(cls, tokens, pos, seq_id, logits) -> Batch:
        return cls(
            np.ascontiguousarray(tokens, np.int32),
            np.ascontiguousarray(pos, np.int32),
            np.ascontiguousarray(seq_id, np.int32),
            np.ascontiguousarray(logits, np.bool_),
        )

    @classmethod
    def for_sequence(
        cls, tokens, pos0: int, seq_id: int = 0, logits_last: bool = True, logits_all: bool = False
    ) -> Batch:
        """Consecutive tokens of one sequence starting at position pos0."""
        n = len(tokens)
        out = np.zeros(n, np.bool_)
        if logits_all:
            out[:] = True
        elif logits_last and n:
            out[-1] = True
        return cls.make(tokens, np.arange(pos0, pos0 + n), np.full(n, seq_id), out)

    @classmethod
    def concat(cls, batches: list[Batch]) -> Batch:
        if not batches:
            return cls.make([], [], [], [])
        embd = attn_end = None
        if any(b.embd is not None for b in batches):
            width = next(b.embd.shape[1] for b in batches if b.embd is not None)
            embd = np.concatenate(
                [
                    b.embd if b.embd is not None else np.zeros((len(b), width), np.float32)
                    for b in batches
                ]
            )
        if any(b.attn_end is not None for b in batches):
            attn_end = np.concatenate(
                [b.attn_end if b.attn_end is not None else b.pos for b in batches]
            ).astype(np.int32, copy=False)
        return cls(
            np.concatenate([b.tokens for b in batches]).astype(np.int32, copy=False),
            np.concatenate([b.pos for b in batches]).astype(np.int32, copy=False),
            np.concatenate([b.seq_id for b in batches]).astype(np.int32, copy=False),
            np.concatenate([b.logits for b in batches]).astype(np.bool_, copy=False),
            embd,
            attn_end,
        )

    def slice(self, i0: int, i1: int) -> Batch:
        return Batch(
            self.tokens[i0:i1],
            self.pos[i0:i1],
            self.seq_id[i0:i1],
            self.logits[i0:i1],
            None if self.embd is None else self.embd[i0:i1],
            None if self.attn_end is None else self.attn_end[i0:i1],
        )
