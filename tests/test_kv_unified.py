"""The unified KV cache (-kvu): one pool of n_ctx cells shared by every sequence."""

from __future__ import annotations

import numpy as np
import pytest

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.errors import KVCacheFullError
from engine.memory import estimate_memory
from engine.model import load_model

TOKENS = [
    5,
    17,
    42,
    9,
    100,
    3,
    77,
    250,
    31,
    8,
    64,
    200,
    12,
    7,
    150,
    99,
    23,
    45,
    61,
    2,
    11,
    19,
    33,
    71,
    88,
    14,
    6,
    140,
    52,
    27,
    91,
    38,
    15,
    66,
    120,
    4,
    180,
    58,
    29,
    73,
]


@pytest.fixture(scope="module")
def tiny(tiny_llama_path):
    return load_model(tiny_llama_path)


def _ref(tiny, tokens):
    return Context(tiny, ContextParams(n_ctx=64)).decode(
        Batch.for_sequence(tokens, 0, logits_all=True)
    )


def _close(a, b, tol=5e-3):
    err = np.abs(a - b).max() / np.abs(b).max()
    assert err < tol, f"max relative error {err:.2e}"


def test_kv_unified_allocates_one_pool_not_one_per_sequence(tiny):
    split = Context(tiny, ContextParams(n_ctx=64, n_seq_max=4))
    unified = Context(tiny, ContextParams(n_ctx=64, n_seq_max=4, kv_unified=True))
    est = estimate_memory(tiny.cfg, 0, 0, n_ctx=64, n_seq_max=4, kv_unified=True)
    assert unified.n_ctx_seq == 64
    assert est.kv_bytes == unified.kv.nbytes == split.kv.nbytes
    assert unified.memory_report().kv_bytes == split.memory_report().kv_bytes
    # what one slot may fill (the desktop's slot table): the whole pool, or its own quarter
    assert (
        unified.memory_report().kv_seq_capacity_bytes
        == est.kv_seq_capacity_bytes
        == unified.kv.nbytes
    )
    assert split.memory_report().kv_seq_capacity_bytes == split.kv.nbytes // 4


def test_kv_unified_interleaved_sequences_match_separate_ones(tiny):
    """Four sequences grow one token at a time, side by side, so their runs must grow and
    move inside the pool; each still decodes exactly as it would alone."""
    ctx = Context(tiny, ContextParams(n_ctx=96, n_seq_max=4, kv_unified=True))
    seqs = [TOKENS[i : i + 20] for i in (0, 5, 10, 15)]
    got: list[list[np.ndarray]] = [[] for _ in seqs]
    for i in range(20):
        out = ctx.decode(
            Batch.concat([Batch.for_sequence([t[i]], i, seq_id=s) for s, t in enumerate(seqs)])
        )
        for s in range(4):
            got[s].append(out[s])
    for s, t in enumerate(seqs):
        _close(np.stack(got[s]), _ref(tiny, t))
    assert ctx.kv.n_cells_free() == 96 - 80


def test_kv_unified_one_sequence_may_fill_the_pool(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=40, n_seq_max=4, kv_unified=True))
    out = ctx.decode(Batch.for_sequence(TOKENS, 0, seq_id=2, logits_all=True))
    _close(out, _ref(tiny, TOKENS))


def test_kv_unified_full_pool_raises_and_keeps_the_cache(tiny):
    ctx = Context(tiny, ContextParams(n_ctx=32, n_seq_max=2, kv_unified=True))
    ctx.decode(Batch.for_sequence(TOKENS[:20], 0, seq_id=0))
    with pytest.raises(KVCacheFullError, match="full"):
        ctx.decode(Batch.for_sequence(TOKENS[:13], 0, seq_id=1))
    assert ctx.kv.seq_len(0) == 20 and ctx.kv.seq_len(1) == 0
    ctx.kv.seq_clear(0)  # freeing a sequence gives its cells back
    ctx.decode(Batch.for_sequence(TOKENS[:13], 0, seq_id=1))
    assert ctx.kv.seq_len(1) == 13


def test_kv_unified_compaction_keeps_every_sequence_intact(tiny):
    """Free cells scattered between runs are packed together for a sequence that needs them."""
    ctx = Context(tiny, ContextParams(n_ctx=64, n_seq_max=4, kv_unified=True))
    for s in range(4):
        ctx.decode(Batch.for_sequence(TOKENS[s : s + 14], 0, seq_id=s))
    ctx.kv.seq_clear(1)
    ctx.kv.seq_rm(3, 6)
    # seq 0 grows to 26 positions: more than any free run, less than all free cells
    out = ctx.decode(Batch.for_sequence(TOKENS[14:26], 14, seq_id=0, logits_all=True))
    _close(out, _ref(tiny, TOKENS[:26])[14:])
    nxt = ctx.decode(
        Batch.concat(
            [
                Batch.for_sequence([TOKENS[16]], 14, seq_id=2),
                Batch.for_sequence([TOKENS[9]], 6, seq_id=3),
            ]
        )
    )
    _close(nxt[0], _ref(tiny, TOKENS[2:16] + [TOKENS[16]])[-1])
    _close(nxt[1], _ref(tiny, TOKENS[3:9] + [TOKENS[9]])[-1])


def test_kv_seq_state_round_trips_into_another_sequence(tiny):
    for unified in (False, True):
        ctx = Context(tiny, ContextParams(n_ctx=64, n_seq_max=2, kv_unified=unified))
        ctx.decode(Batch.for_sequence(TOKENS[:12], 0, seq_id=0))
        k, v = ctx.kv.seq_state(0)
        ctx.kv.set_seq_state(1, k, v)
        assert ctx.kv.seq_len(1) == 12
        out = ctx.decode(Batch.for_sequence(TOKENS[12:16], 12, seq_id=1, logits_all=True))
        _close(out, _ref(tiny, TOKENS[:16])[12:])


@pytest.mark.parametrize(
    "argv,n_seq,unified",
    [
        ([], 4, True),  # -np auto: 4 slots sharing one pool, as llama-server
        (["-np", "2"], 2, False),
        (["-np", "2", "-kvu"], 2, True),
        (["-np", "2", "-kvu", "-no-kvu"], 2, False),
        (["--no-kv-unified"], 4, True),  # auto parallelism turns it on whatever was asked
    ],
)
def test_kv_unified_flag_rules(argv, n_seq, unified):
    import argparse

    from engine import params
    from engine.commands import serve

    sub = argparse.ArgumentParser().add_subparsers()
    p = params.to_context_params(params.common_params(serve.add_parser(sub).parse_args(argv)))
    assert (p.n_seq_max, p.kv_unified) == (n_seq, unified)


def test_kv_large_cache_is_lazily_mapped_and_decodes(tiny):
    """Caches of 1 MiB and more sit on their own anonymous mappings (see kv_cache._zeros)."""
    import mmap

    ctx = Context(tiny, ContextParams(n_ctx=16384, n_seq_max=2, kv_unified=True))
    assert ctx.kv.k[0].nbytes >= 1 << 20
    base = ctx.kv.k[0]
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)
    _close(ctx.decode(Batch.for_sequence(TOKENS, 0, seq_id=1, logits_all=True)), _ref(tiny, TOKENS))
