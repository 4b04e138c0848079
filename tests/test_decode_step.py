"""The compiled single-token layer step (engine/models/step.py): for every architecture that
declares one, decoding through it gives the Python blocks' logits bit for bit (float and int8
paths, f16 and f32 KV caches, split and unified caches, sliding windows, mixed weight types);
the exact float16 rounding of its KV store; when it serves and when it does not."""

from __future__ import annotations

import logging
import os

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine import ops
from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.model import load_model
from engine.models import ARCHITECTURES, step
from engine.models.spec import LayerSpec
from ggufgen import write_tiny_model
from ggufgen_gptoss import write_tiny_gptoss
from ggufgen_moe import write_tiny_moe
from sweeps import sweep

TOKENS = np.array([1, 5, 9, 23, 7, 11, 3, 2, 8, 13, 17, 4, 6, 10, 12, 14], np.int32)
ARCHS = {
    "llama": Q.Q4_0,
    "qwen2": Q.Q4_1,
    "qwen3": Q.F16,
    "gemma2": Q.Q5_0,
    "gemma3": Q.Q8_0,
    "smollm3": Q.Q8_0,  # its 4th layer has no RoPE
    "olmo2": Q.Q5_1,  # post-norms only, Q/K norms over the whole projections, sliding layers
    "phi3": Q.Q4_0,  # fused Q|K|V and gate|up, partial LongRoPE
    "granite": Q.BF16,
}  # residual_scale on both branches
MOE_EXPERTS = Q.Q4_K  # qwen3moe: the router in the step, the experts in a second compiled call


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("step-models")
    # n_embd 256: the K-quants' super-blocks fit; sliding windows (gemma) of 8 are crossed;
    # smollm3's fourth layer is its first without RoPE
    # (olmo2's too, after three sliding layers)
    return {
        a: write_tiny_model(
            d / f"{a}.gguf",
            a,
            n_layer=4 if a in ("smollm3", "olmo2") else 3,
            n_embd=256,
            n_head=4,
            n_head_kv=2,
            n_ff=512,
            qtype=qt,
            sliding=a == "olmo2",
        )
        for a, qt in ARCHS.items()
    } | {
        "qwen3moe": write_tiny_moe(
            d / "qwen3moe.gguf",
            "qwen3moe",
            n_layer=3,
            n_embd=256,
            n_head=4,
            n_head_kv=2,
            n_ff=512,
            n_expert=8,
            n_expert_used=3,
            n_ff_exp=256,
            qtype=Q.Q8_0,
            expert_qtype=MOE_EXPERTS,
        ),
        # a gated shared expert; Q/K/V biases in layers 1 and 2 only
        "qwen2moe": write_tiny_moe(
            d / "qwen2moe.gguf",
            "qwen2moe",
            n_layer=3,
            n_embd=256,
            n_head=4,
            n_head_kv=2,
            n_ff=512,
            n_expert=8,
            n_expert_used=3,
            n_ff_exp=256,
            n_ff_shexp=512,
            qtype=Q.Q8_0,
            expert_qtype=Q.Q4_0,
            omit=tuple(f"blk.0.attn_{w}.bias" for w in "qkv"),
        ),
        # sinks, biases everywhere, swiglu_oai experts, sliding layers
        "gpt-oss": write_tiny_gptoss(
            d / "gpt-oss.gguf",
            n_layer=4,
            n_embd=256,
            n_head=8,
            n_head_kv=2,
            head_dim=32,
            n_expert=8,
            n_expert_used=3,
            n_ff_exp=256,
            qtype=Q.Q8_0,
        ),
        "gpt-oss-mxfp4": write_tiny_gptoss(
            d / "gpt-oss-mxfp4.gguf",
            n_layer=2,
            n_embd=256,
            n_head=8,
            n_head_kv=2,
            head_dim=32,
            n_expert=8,
            n_expert_used=4,
            n_ff_exp=256,
            qtype=Q.MXFP4,
        ),
    }


@pytest.fixture
def served(monkeypatch) -> list[int]:
    """Per layer run of a ubatch, in order: its token count when a step served it, else 0."""
    out: list[int] = []
    real_run = step.UbatchSteps.run

    def counting_run(self, il):
        done = real_run(self, il)
        out.append(self.s.n_tokens if done else 0)
        return done

    monkeypatch.setattr(step.UbatchSteps, "run", counting_run)
    return out


def decode_all(model, flag: str, monkeypatch, n_prefill: int = 4, **ctx_kw) -> np.ndarray:
    """Logits of a prefill, then of one-token decodes, with GGSTATION_STEP=flag."""
    monkeypatch.setenv("GGSTATION_STEP", flag)
    ctx = Context(model, ContextParams(n_ctx=64, **ctx_kw))
    rows = [ctx.decode(Batch.for_sequence(TOKENS[:n_prefill], 0, 0))]
    rows += [
        ctx.decode(Batch.for_sequence(TOKENS[i : i + 1], i, 0))
        for i in range(n_prefill, len(TOKENS))
    ]
    if flag == "1":
        steps = step.for_context(ctx)
        assert steps is not None and all(f is not None for f in steps.one)
    return np.concatenate(rows)


STEP_ARCHS = [*sorted(ARCHS), "qwen3moe", "qwen2moe", "gpt-oss", "gpt-oss-mxfp4"]


def test_every_architecture_is_checked_against_its_block():
    """A new architecture joins STEP_ARCHS (and the tiny models above) or this fails."""
    assert set(ARCHITECTURES) <= set(STEP_ARCHS)


@pytest.mark.parametrize("arch", ["llama", "phi3", "olmo2", "qwen2moe", "gpt-oss"])
def test_layers_have_the_tensors_their_description_reads(tiny, arch):
    model = load_model(tiny[arch])
    for lw in model.weights.layers:
        assert set(model.arch.spec.layer.tensors) <= set(vars(lw))


@pytest.mark.parametrize("arch", sweep(STEP_ARCHS, fast={"llama", "gemma3", "phi3"}))
def test_step_gives_the_python_blocks_logits_bit_for_bit(tiny, arch, monkeypatch):
    """The compiled step derived from the architecture's LayerSpec against the Python block
    (models/decoder.py) derived from the same description."""
    model = load_model(tiny[arch])
    want = decode_all(model, "0", monkeypatch)
    got = decode_all(model, "1", monkeypatch)
    assert np.array_equal(got, want)


@pytest.mark.float
@pytest.mark.parametrize("arch", sweep(["llama", "qwen2", "gemma2", "qwen3moe"], fast={"llama"}))
def test_step_float_path(tiny, arch, monkeypatch):
    """The float oracle (`--no-int8`) through the steps too: the Python blocks' bits."""
    model = load_model(tiny[arch])
    assert model.decode_path == "float"  # the marker's default, which the context takes
    assert np.array_equal(decode_all(model, "1", monkeypatch), decode_all(model, "0", monkeypatch))


@pytest.mark.parametrize(
    "arch",
    sweep(
        ["llama", "gemma3", "phi3", "olmo2", "qwen3moe", "qwen2moe", "gpt-oss", "gpt-oss-mxfp4"],
        fast={"gemma3"},
    ),
)
def test_step_int8_path_and_f32_cache(tiny, arch, monkeypatch):
    model = load_model(tiny[arch], decode_path="int8")
    want = decode_all(model, "0", monkeypatch, type_k="f32", type_v="f32")
    got = decode_all(model, "1", monkeypatch, type_k="f32", type_v="f32")
    assert np.array_equal(got, want)
    assert not np.array_equal(got, decode_all(model, "1", monkeypatch))  # the f16 cache is another


def test_step_switches_with_the_decode_path(tiny, monkeypatch):
    """The context's decode path changed between two decodes: the steps follow it."""
    monkeypatch.setenv("GGSTATION_STEP", "1")
    ctx = Context(load_model(tiny["llama"]), ContextParams(n_ctx=64))
    ctx.decode(Batch.for_sequence(TOKENS[:4], 0, 0))
    ctx.decode(Batch.for_sequence(TOKENS[4:5], 4, 0))
    first = step.for_context(ctx)
    ctx.decode_path = "int8"
    assert step.for_context(ctx) is not first and step.for_context(ctx).path == "int8"


@pytest.mark.parametrize("unified", [False, True])
def test_step_serves_sequences_of_split_and_unified_caches(tiny, unified, monkeypatch):
    """Two sequences decoded turn by turn (one-token ubatches), in their own cells."""
    model = load_model(tiny["qwen3"])

    def run(flag):
        monkeypatch.setenv("GGSTATION_STEP", flag)
        ctx = Context(model, ContextParams(n_ctx=128, n_seq_max=2, kv_unified=unified))
        out = [
            ctx.decode(Batch.for_sequence(TOKENS[:5], 0, 0)),
            ctx.decode(Batch.for_sequence(TOKENS[3:6], 0, 1)),
        ]
        for i in range(6):
            out.append(ctx.decode(Batch.for_sequence(TOKENS[i : i + 1], 5 + i, 0)))
            out.append(ctx.decode(Batch.for_sequence(TOKENS[i + 1 : i + 2], 3 + i, 1)))
        return np.concatenate(out)

    assert np.array_equal(run("1"), run("0"))


@pytest.mark.parametrize(
    ("arch", "unified", "int8"),
    sweep(
        [
            ("llama", True, False),
            ("qwen2", False, False),
            ("gemma3", True, True),
            ("gemma2", False, False),
            ("phi3", True, True),
            ("olmo2", False, False),
            ("granite", True, False),
        ],
        fast={("llama", True, False), ("gemma3", True, True)},
    ),
)
def test_several_token_step_serves_slots_decoding_together(
    tiny, arch, unified, int8, served, monkeypatch
):
    """Ubatches of 2..8 tokens: three sequences' tokens together (interleaved, as a scheduler
    may order them), and three tokens of one sequence: the Python blocks' logits bit for bit."""
    model = load_model(tiny[arch], decode_path="int8" if int8 else "float")

    def run(flag):
        monkeypatch.setenv("GGSTATION_STEP", flag)
        ctx = Context(model, ContextParams(n_ctx=192, n_seq_max=3, kv_unified=unified))
        out = [ctx.decode(Batch.for_sequence(TOKENS[:5], 0, q)) for q in range(3)]
        p = [5, 5, 5]
        for i in range(10):  # past gemma's sliding window of 8
            seqs = [1, 0, 2] if i % 2 else [0, 2, 1]
            b = Batch.make(
                TOKENS[[(i + q) % 16 for q in seqs]], [p[q] for q in seqs], seqs, [True] * 3
            )
            out.append(ctx.decode(b))
            for q in seqs:
                p[q] += 1
        out.append(ctx.decode(Batch.for_sequence(TOKENS[:3], p[1], 1, logits_all=True)))
        if flag == "1":
            steps = step.for_context(ctx)
            assert steps is not None and all(f is not None for f in steps.many)
        return np.concatenate(out)

    assert np.array_equal(run("1"), run("0"))
    assert served.count(3) == 11 * len(
        model.weights.layers
    )  # every layer of the 3-token ubatches went through a step


def test_step_groups_mixed_weight_types_as_the_python_path(tmp_path, monkeypatch):
    """attn_v and ffn_up of another type than their neighbours: launches per type, as
    quants.matvec_many makes them."""
    a = load_model(
        write_tiny_model(
            tmp_path / "a.gguf", "llama", n_layer=2, n_embd=256, n_ff=512, qtype=Q.Q5_1
        )
    )
    b = load_model(
        write_tiny_model(
            tmp_path / "b.gguf", "llama", n_layer=2, n_embd=256, n_ff=512, qtype=Q.Q8_0
        )
    )
    for la, lb in zip(a.weights.layers, b.weights.layers, strict=True):
        la.attn_v, la.ffn_up, la.attn_output = lb.attn_v, lb.ffn_up, lb.attn_output
    for path, kern in (
        ("float", "_matvec_{}"),
        ("x16", "_matvec_rp16_{}"),
        ("int8", "_matvec_rp_{}"),
    ):
        src = step.render(
            a.arch.spec.layer, a.weights.layers[0], np.dtype(np.uint16), np.dtype(np.uint16), path
        )
        assert (
            src.count(kern.format("q5_1") + " as") == 1
            and src.count(kern.format("q8_0") + " as") == 1
        ), path
    assert np.array_equal(decode_all(a, "1", monkeypatch), decode_all(a, "0", monkeypatch))


def test_auto_mode_leaves_tiny_layers_to_python(tiny, monkeypatch):
    monkeypatch.delenv("GGSTATION_STEP", raising=False)
    assert step.mode() == "auto"
    ctx = Context(load_model(tiny["llama"]), ContextParams(n_ctx=64))
    ctx.decode(Batch.for_sequence(TOKENS[:2], 0, 0))
    assert step.for_context(ctx) is None  # 0.2 MB a layer: below MIN_LAYER_BYTES
    monkeypatch.setenv("GGSTATION_STEP", "0")
    assert step.mode() == "0"


@pytest.mark.model
@pytest.mark.parametrize("name", sweep(["smollm2", "gemma3"], fast={"smollm2"}))
def test_starter_models_decode_through_the_step_by_default(name, request, monkeypatch):
    """By default (auto) on real models, every layer (Gemma 3's K-quants too), same logits."""
    monkeypatch.delenv("GGSTATION_STEP", raising=False)
    model = load_model(request.getfixturevalue(f"{name}_path"))
    ctx = Context(model, ContextParams(n_ctx=64))
    ctx.decode(Batch.for_sequence(TOKENS[:4], 0, 0))
    got = ctx.decode(Batch.for_sequence(TOKENS[4:5], 4, 0))
    steps = step.for_context(ctx)
    assert steps is not None and all(f is not None for f in steps.one)
    monkeypatch.setenv("GGSTATION_STEP", "0")
    ctx2 = Context(model, ContextParams(n_ctx=64))
    ctx2.decode(Batch.for_sequence(TOKENS[:4], 0, 0))
    assert np.array_equal(ctx2.decode(Batch.for_sequence(TOKENS[4:5], 4, 0)), got)


def test_step_modules_are_written_once_per_content(tmp_path, monkeypatch):
    monkeypatch.setenv("GGSTATION_STEP_DIR", str(tmp_path / "steps"))
    monkeypatch.setattr(step, "_modules", {})  # none loaded yet in this process
    lw = load_model(
        write_tiny_model(tmp_path / "m.gguf", "llama", n_layer=1, qtype=Q.Q8_0)
    ).weights.layers[0]
    src = step.render(LayerSpec(), lw, np.dtype(np.uint16), np.dtype(np.uint16), False)
    fn = step.load_step(src)
    files = sorted((tmp_path / "steps").glob("step_*.py"))
    assert len(files) == 1 and files[0].read_text() == src
    assert step.load_step(src) is fn
    step.load_step(step.render(LayerSpec(), lw, np.dtype(np.float32), np.dtype(np.uint16), False))
    assert len(list((tmp_path / "steps").glob("step_*.py"))) == 2


def test_unwritable_step_dir_falls_back_to_python_blocks(tiny, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GGSTATION_STEP_DIR", str(blocker / "steps"))
    monkeypatch.setattr(step, "_modules", {})
    want = decode_all(load_model(tiny["llama"]), "0", monkeypatch)
    monkeypatch.setenv("GGSTATION_STEP", "1")
    ctx = Context(load_model(tiny["llama"]), ContextParams(n_ctx=64))
    with caplog.at_level(logging.WARNING, logger="ggstation.engine"):
        rows = [ctx.decode(Batch.for_sequence(TOKENS[:4], 0, 0))]
        rows += [
            ctx.decode(Batch.for_sequence(TOKENS[i : i + 1], i, 0)) for i in range(4, len(TOKENS))
        ]
    assert "compiled decode steps unavailable" in caplog.text
    assert np.array_equal(np.concatenate(rows), want)


@numba.njit
def _to_f16(bits):
    out = np.empty(bits.shape[0], np.uint16)
    for i in range(bits.shape[0]):
        out[i] = ops.f32_to_f16_bits(bits[i])
    return out


def test_f16_store_rounds_as_numpy():
    """Ties to even, subnormal halves, overflow to infinity, signed zeros; NaN stays NaN."""
    rng = np.random.default_rng(0)
    bits = np.concatenate(
        [
            rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32),
            np.arange(0x33000000 - 64, 0x38800000 + 64, 4099, dtype=np.uint32),  # subnormal halves
            (np.arange(1 << 16, dtype=np.uint32) << 13) | 0x1000,  # every exact tie
            np.arange(0x477FE000, 0x47800100, 7, dtype=np.uint32),  # around the largest half
            np.array(
                [0, 0x7F800000, 0x7FC00000, 0x7F800001, 0x33000000, 0x33000001, 0x387FFFFF],
                np.uint32,
            ),
        ]
    )
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    f = bits.view(np.float32)
    with np.errstate(all="ignore"):
        want = f.astype(np.float16)
    got = _to_f16(bits).view(np.float16)
    nan = np.isnan(f)
    assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    assert np.isnan(got[nan]).all()


def test_attention_plan_goes_parallel_from_a_few_dozen_positions():
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    assert not ops.AttentionPlan(1, 9, 3, 64, 64, 16, 0).parallel
    if numba.get_num_threads() > 1:
        p = ops.AttentionPlan(1, 9, 3, 64, 64, 256, 0)
        assert p.parallel and p.n_split > 1 and p.n_split * p.split_len >= 256
    w = ops.AttentionPlan(1, 9, 3, 64, 64, 4096, 8)  # a window of 8: little work
    assert not w.parallel and w.n_split == 1


def test_step_env_values():
    for v, want in (
        ("0", "0"),
        ("off", "0"),
        ("1", "1"),
        ("on", "1"),
        ("auto", "auto"),
        ("", "auto"),
    ):
        os.environ["GGSTATION_STEP"] = v
        try:
            assert step.mode() == want
        finally:
            del os.environ["GGSTATION_STEP"]


def test_steps_are_compiled_with_the_context_for_a_decodes_types(tiny, monkeypatch):
    """Built and compiled when the context is made: the first token compiles nothing more."""
    monkeypatch.setenv("GGSTATION_STEP", "1")
    ctx = Context(load_model(tiny["gemma3"]), ContextParams(n_ctx=64, n_seq_max=2, kv_unified=True))
    steps = ctx.layer_steps
    assert steps is not None and steps.any
    before = {id(f): len(f.signatures) for f in steps.one + steps.many}
    assert set(before.values()) == {1}
    ctx.decode(Batch.for_sequence(TOKENS[:3], 0, 1))
    ctx.decode(Batch.for_sequence(TOKENS[3:4], 3, 1))
    assert step.for_context(ctx) is steps
    assert {id(f): len(f.signatures) for f in steps.one + steps.many} == before


def test_a_damaged_step_module_is_written_again(tmp_path, monkeypatch):
    """A step file cut short (or edited) on disk is replaced by the right text, not imported."""
    monkeypatch.setenv("GGSTATION_STEP_DIR", str(tmp_path / "steps"))
    monkeypatch.setattr(step, "_modules", {})
    lw = load_model(
        write_tiny_model(tmp_path / "m.gguf", "llama", n_layer=1, qtype=Q.Q4_0)
    ).weights.layers[0]
    src = step.render(LayerSpec(), lw, np.dtype(np.uint16), np.dtype(np.uint16), False)
    step.load_step(src)
    (path,) = (tmp_path / "steps").glob("step_*.py")
    path.write_text(src[: len(src) // 2])  # a syntax error if imported
    monkeypatch.setattr(step, "_modules", {})
    assert step.load_step(src) is not None
    assert path.read_text() == src


def test_prune_deletes_other_versions_old_steps_and_their_cache(tmp_path):
    d, cache = tmp_path / "steps", tmp_path / "steps" / "__pycache__"
    cache.mkdir(parents=True)
    now = 1_000_000_000.0
    week = step.STALE_AFTER_S

    def put(name, age, cached=True):
        f = d / name
        f.write_text("# a step\n")
        os.utime(f, (now - age, now - age))
        if cached:
            for ext in (".step-12.py311.nbi", ".step-12.py311.1.nbc"):
                (cache / (f.stem + ext)).write_bytes(b"code")
        return f

    mine = step._file_stem("0" * 20)
    keep = [
        put(mine + ".py", 10 * week),  # this version's: kept however old
        put("step_deadbeef_" + "1" * 20 + ".py", week / 2),  # another version's, recent
        put("notes.txt", 10 * week, cached=False),
    ]
    gone = [
        put("step_deadbeef_" + "2" * 20 + ".py", week + 60),
        put("step_" + "3" * 20 + ".py", 2 * week),
    ]  # an older engine's names had no version
    tmp = put("tmpab12.tmp", 2 * 86400, cached=False)
    assert step.prune(d, cache, now=now) == 2
    assert all(f.exists() for f in keep) and not any(f.exists() for f in gone) and not tmp.exists()
    left = sorted(c.name.split(".")[0] for c in cache.iterdir())
    assert left == sorted([keep[0].stem] * 2 + [keep[1].stem] * 2)
    assert step.prune(tmp_path / "absent", None, now=now) == 0


def test_making_a_context_prunes_stale_steps_once(tiny, tmp_path, monkeypatch):
    d = tmp_path / "steps"
    d.mkdir()
    stale = d / ("step_deadbeef_" + "4" * 20 + ".py")
    stale.write_text("# a step\n")
    old = stale.stat().st_mtime - step.STALE_AFTER_S - 60
    os.utime(stale, (old, old))
    monkeypatch.setenv("GGSTATION_STEP_DIR", str(d))
    monkeypatch.setenv("GGSTATION_STEP", "1")
    monkeypatch.setattr(step, "_modules", {})
    monkeypatch.setattr(step, "_pruned", False)
    Context(load_model(tiny["llama"]), ContextParams(n_ctx=64))
    assert not stale.exists() and list(d.glob(step._file_stem("") + "*.py"))
    stale.write_text("# a step\n")
    os.utime(stale, (old, old))
    Context(load_model(tiny["llama"]), ContextParams(n_ctx=64))
    assert stale.exists()  # once per process


def test_layer_spec_refuses_variants_the_template_has_not():
    with pytest.raises(ValueError):
        LayerSpec(qk_norm="per-row")
    with pytest.raises(ValueError):
        LayerSpec(act="relu")
    with pytest.raises(ValueError):
        LayerSpec(fused=True, act="gelu")
    assert LayerSpec(fused=True).weights[:3] == ("attn_qkv",) * 3


@pytest.mark.parametrize(
    ("arch", "int8"),
    sweep(
        [("qwen3moe", False), ("qwen2moe", True), ("gpt-oss", False)], fast={("qwen3moe", False)}
    ),
)
def test_moe_steps_serve_slots_decoding_together(tiny, arch, int8, served, monkeypatch):
    """Several sequences on a MoE model: ubatches of three tokens run their attention and router
    in the several-token step and their experts through moe.ffn, one-token ubatches take the
    experts step; the logits are the Python blocks' bit for bit."""
    model = load_model(tiny[arch], decode_path="int8" if int8 else "float")

    def run(flag):
        monkeypatch.setenv("GGSTATION_STEP", flag)
        ctx = Context(model, ContextParams(n_ctx=192, n_seq_max=3))
        out = [ctx.decode(Batch.for_sequence(TOKENS[:5], 0, q)) for q in range(3)]
        p = [5, 5, 5]
        for i in range(10):
            seqs = [2, 0, 1] if i % 3 == 0 else [i % 3]  # three together, then one at a time
            b = Batch.make(
                TOKENS[[(i + q) % 16 for q in seqs]], [p[q] for q in seqs], seqs, [True] * len(seqs)
            )
            out.append(ctx.decode(b))
            for q in seqs:
                p[q] += 1
        if flag == "1":
            steps = step.for_context(ctx)
            assert steps is not None and all(f is not None for f in steps.one + steps.many)
        return np.concatenate(out)

    assert np.array_equal(run("1"), run("0"))
    n_layer = len(model.weights.layers)
    assert served.count(3) == 4 * n_layer and served.count(1) == 6 * n_layer
