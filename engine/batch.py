"""Batch: the input of one Context.decode call, like llama_batch.

Each entry is a token at a position in a sequence, and says whether its logits are wanted.
One batch may mix sequences: a prompt chunk of one and single decode tokens of others.
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

    def __post_init__(self):
        n = len(self.tokens)
        for name, field in (("pos", self.pos), ("seq_id", self.seq_id), ("logits", self.logits)):
            if len(field) != n:
                raise ValueError(f"batch field '{name}' has {len(field)} entries, expected {n}")

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
        return cls.make(
            np.concatenate([b.tokens for b in batches]),
            np.concatenate([b.pos for b in batches]),
            np.concatenate([b.seq_id for b in batches]),
            np.concatenate([b.logits for b in batches]),
        )

    def slice(self, i0: int, i1: int) -> Batch:
        return Batch(self.tokens[i0:i1], self.pos[i0:i1], self.seq_id[i0:i1], self.logits[i0:i1])
