"""Developer check (not collected by pytest): the engine's logits against llama.cpp's own.

For each architecture it writes the project's tiny random model (a generator per arch, from
GENERATORS), runs `llama-perplexity --kl-divergence-base FILE` on a short text, decodes that
file (llama.cpp's tokens and quantised log-probabilities per scored position), runs our
Context over the same tokens and chunks, and prints per case: both perplexities, mean and max
KL divergence (llama.cpp's distribution as the base), top-1 agreement and the largest
|delta log p| over llama.cpp's top 10. `--model FILE` checks any GGUF instead (a real model).

    python tests/xcheck_llamacpp.py --arch llama qwen2 qwen3 gemma2 gemma3 phi3
    python tests/xcheck_llamacpp.py --model /tmp/x/smollm2-f32.gguf -c 128 --chunks 8

Expect on F32 models KLD ~1e-7 and |delta log p| ~1e-3 (llama.cpp rounds queries and softmax to
f16 against the f16 KV cache; `--kv f32` brings it to the file's 16-bit resolution, ~1.2e-4),
and on quantised ones KLD ~1e-6..1e-3 with |delta log p| ~0.1 (llama.cpp rounds activations to
8 bits before quantised matmuls; `--ggml-q8` does the same to ours; MoE routing amplifies it).
llama.cpp runs with flash attention off (its CPU flash attention accumulates V in f16).
tests/data/README.md records the results and what each diagnostic flag explains.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # ggufgen*, as the tests import them
sys.path.insert(0, str(HERE.parent))  # this worktree's engine

LLAMA_BIN = Path(
    os.environ.get("LLAMA_CPP_BIN", "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
)
TEXT = HERE / "data" / "gpl-3.txt"
# llama_context rounds n_ctx (and n_ctx_seq) up to a multiple of this (llama-context.cpp)
LLAMA_CTX_PAD = 256


@dataclass(frozen=True)
class Generator:
    module: str  # under tests/
    function: str  # (path, arch=..., qtype=..., **kwargs) -> path of the written GGUF
    contexts: tuple[int, ...] = (
        64,
    )  # -c values to check (phi3: both sides of its original context)
    kwargs: tuple[tuple[str, object], ...] = ()
    arch: str | None = None  # the arch to pass when the table's name is a variant
    pass_arch: bool = True  # the function takes arch= (one-arch generators do not)
    # general.name to give the file instead of the generator's (same length; see phi3)
    rename: str | None = None


# arch -> how to write its tiny model; extend as generators land
GENERATORS: dict[str, Generator] = {
    "llama": Generator("ggufgen", "write_tiny_model"),
    "qwen2": Generator("ggufgen", "write_tiny_model"),
    "qwen3": Generator("ggufgen", "write_tiny_model"),
    "gemma2": Generator("ggufgen", "write_tiny_model"),
    "gemma3": Generator("ggufgen", "write_tiny_model"),
    # llama.cpp's vocab loader sees "phi3" in general.name and looks up "</s>", "<s>" and
    # "<|endoftext|>" (token_to_id.at), which the tiny SentencePiece vocabulary lacks: it
    # refuses the file ("unordered_map::at"); a name without "phi3" loads
    "phi3": Generator("ggufgen", "write_tiny_model", (16, 32, 64), rename="tiny-phi_"),
    "smollm3": Generator("ggufgen", "write_tiny_model"),
    "olmo2": Generator("ggufgen", "write_tiny_model"),
    "olmo3": Generator("ggufgen", "write_tiny_model", kwargs=(("sliding", True),), arch="olmo2"),
    "granite": Generator("ggufgen", "write_tiny_model"),
    "qwen2moe": Generator("ggufgen_moe", "write_tiny_moe"),
    "qwen3moe": Generator("ggufgen_moe", "write_tiny_moe"),
    "gpt-oss": Generator("ggufgen_gptoss", "write_tiny_gptoss", pass_arch=False),
}


@dataclass
class LlamaLogits:
    """A --kl-divergence-base file: llama.cpp's tokens, and per scored position the
    log-probabilities it saved (16-bit: scale * q + min_log_prob; q = 0 where the logit is more
    than 16 below the maximum, so those are clamped)."""

    n_ctx: int
    n_vocab: int
    tokens: np.ndarray  # (n_chunk, n_ctx) int32, before BOS substitution
    logp: np.ndarray  # (n_chunk, n_ctx - 1 - n_ctx // 2, n_vocab) float64
    clamped: np.ndarray  # same shape, bool: below llama.cpp's 16-nat window


def read_kld_base(path: Path) -> LlamaLogits:
    """Decode tools/perplexity/perplexity.cpp's logits file: "_logits_", int32 n_ctx, n_vocab,
    n_chunk, int32 tokens[n_chunk * n_ctx], then per scored row nv = 2*ceil(n_vocab/2) + 4
    uint16 (float32 scale and min_log_prob in the first four, then one uint16 per token)."""
    raw = path.read_bytes()
    if raw[:8] != b"_logits_":
        raise ValueError(f"{path}: not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw, np.int32, 3, 8)
    off = 20
    tokens = np.frombuffer(raw, np.int32, n_chunk * n_ctx, off).reshape(n_chunk, n_ctx)
    off += tokens.nbytes
    nv = 2 * ((n_vocab + 1) // 2) + 4
    n_row = n_ctx - 1 - n_ctx // 2
    rows = np.frombuffer(raw, np.uint16, n_chunk * n_row * nv, off).reshape(n_chunk, n_row, nv)
    if off + rows.nbytes != len(raw):
        raise ValueError(f"{path}: {len(raw) - off - rows.nbytes} bytes left over; format changed?")
    head = np.ascontiguousarray(rows[..., :4]).view(np.float32)  # (.., 2): scale, min_log_prob
    q = rows[..., 4 : 4 + n_vocab].astype(np.float64)
    logp = head[..., :1].astype(np.float64) * q + head[..., 1:2].astype(np.float64)
    return LlamaLogits(int(n_ctx), int(n_vocab), tokens.copy(), logp, q == 0)


@dataclass
class Result:
    case: str
    n_chunk: int = 0
    n_scored: int = 0
    ppl_llama: float = float("nan")
    ppl_ours: float = float("nan")
    kld_mean: float = float("nan")
    kld_max: float = float("nan")
    top1: float = float("nan")
    dlogp_max: float = float("nan")  # over llama.cpp's top 10, where not clamped
    same_tokens: bool | None = None  # our tokenizer gives llama.cpp's tokens for the text
    error: str = ""
    note: str = ""
    seconds_llama: float = 0.0
    seconds_ours: float = 0.0


def run_llama(
    model: Path, text: Path, n_ctx: int, n_chunk: int, out: Path, kv: str, threads: int
) -> tuple[float, str]:
    """llama-perplexity writing `out`; returns (its final PPL, its log)."""
    cmd = [
        str(LLAMA_BIN / "llama-perplexity"),
        "-m",
        str(model),
        "-f",
        str(text),
        "-c",
        str(n_ctx),
        "-b",
        str(n_ctx),
        "--chunks",
        str(n_chunk),
        "-t",
        str(threads),
        "-fa",
        "off",
        "-ctk",
        kv,
        "-ctv",
        kv,
        "--kl-divergence-base",
        str(out),
    ]
    for _ in range(
        8
    ):  # its asynchronous logger sometimes loses the last lines at exit (under load)
        # to a file, not a pipe: through a pipe its logger loses the final lines far more often
        log_file = out.with_suffix(".log")
        with open(log_file, "wb") as f:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        log = log_file.read_text(errors="replace")
        # the final estimate, else the running one after the last chunk ("[N]ppl,")
        m = re.search(r"Final estimate: PPL = ([0-9.eE+inf-]+)", log) or re.search(
            rf"\[{n_chunk}\]([0-9.eE+inf-]+),", log
        )
        if p.returncode != 0 or m:
            break
    if p.returncode != 0 or not out.exists():
        bad = [
            ln
            for ln in log.splitlines()
            if re.search(r"error|failed|unknown|missing|not supported|invalid|assert", ln, re.I)
        ]
        why = " | ".join(bad[-6:]) or log[-800:]
        raise RuntimeError(f"llama-perplexity failed (rc {p.returncode}): {why}")
    return float(m.group(1)) if m else float("nan"), log


def our_logprobs(model, base: LlamaLogits, kv: str, pad_ctx: bool = True) -> np.ndarray:
    """Our log-softmax (float64) at llama.cpp's scored positions, chunk by chunk as
    llama-perplexity evaluates them (each from an empty cache, BOS first where the model adds it).
    pad_ctx: size our context as llama_context does, -c rounded up to a multiple of 256 (what
    LongRoPE's long/short choice sees)."""
    from engine.batch import Batch
    from engine.context import Context, ContextParams

    tok = model.tokenizer
    n_ctx = base.n_ctx
    first = n_ctx // 2
    n_kv = -(-n_ctx // LLAMA_CTX_PAD) * LLAMA_CTX_PAD if pad_ctx else n_ctx
    ctx = Context(
        model,
        ContextParams(n_ctx=n_kv, n_batch=n_ctx, n_ubatch=min(512, n_ctx), type_k=kv, type_v=kv),
    )
    out = np.empty(base.logp.shape)
    for c, chunk in enumerate(base.tokens):
        ids = chunk.copy()
        if tok.add_bos:
            ids[0] = tok.bos_id
        want = np.zeros(n_ctx, np.bool_)
        want[first : n_ctx - 1] = True
        ctx.kv.seq_clear(0)
        lg = ctx.decode(Batch.make(ids, np.arange(n_ctx), np.zeros(n_ctx), want)).astype(np.float64)
        lg -= lg.max(1, keepdims=True)
        out[c] = lg - np.log(np.exp(lg).sum(1, keepdims=True))
    return out


def tokenizer_agrees(model, text: Path, want: np.ndarray) -> bool:
    text_s = text.read_text(encoding="utf-8", errors="replace")
    ids = model.tokenizer.encode(text_s, add_special=True, parse_special=False)
    flat = want.reshape(-1)
    return len(ids) >= len(flat) and bool(np.array_equal(np.asarray(ids[: len(flat)]), flat))


def compare(
    case: str,
    model: Path,
    text: Path,
    n_ctx: int,
    n_chunk: int,
    work: Path,
    kv: str,
    threads: int,
    pad_ctx: bool,
    base_file: Path | None = None,
) -> Result:
    """One case; base_file: an existing --kl-divergence-base file (e.g. llama.cpp on the F32
    model) to measure our run of `model` against, instead of running llama.cpp on `model`."""
    res = Result(case)
    kld_file = base_file or work / (model.stem + f"-c{n_ctx}.kld")
    try:
        t0 = time.perf_counter()
        if base_file is None:
            res.ppl_llama, _ = run_llama(model, text, n_ctx, n_chunk, kld_file, kv, threads)
        res.seconds_llama = time.perf_counter() - t0
        base = read_kld_base(kld_file)
        if base_file is not None:
            base = LlamaLogits(
                base.n_ctx,
                base.n_vocab,
                base.tokens[:n_chunk],
                base.logp[:n_chunk],
                base.clamped[:n_chunk],
            )
        from engine.model import load_model

        t0 = time.perf_counter()
        ours_model = load_model(model, n_threads=threads)
        ours = our_logprobs(ours_model, base, kv, pad_ctx)
        res.seconds_ours = time.perf_counter() - t0
        res.same_tokens = tokenizer_agrees(ours_model, text, base.tokens)
    except Exception as e:  # report the case and go on with the others
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.n_chunk, n_row = base.tokens.shape[0], base.logp.shape[1]
    first = n_ctx // 2
    targets = base.tokens[:, first + 1 : first + 1 + n_row]
    nll = -np.take_along_axis(ours, targets[..., None], 2)[..., 0]
    res.n_scored = nll.size
    if np.isnan(res.ppl_llama):  # from the file: 16-bit, and clamped 16 nats below the top
        res.ppl_llama = float(np.exp(-np.take_along_axis(base.logp, targets[..., None], 2).mean()))
        n_clamped = int(np.take_along_axis(base.clamped, targets[..., None], 2).sum())
        res.note = (
            f"llama.cpp's PPL from the logits file {kld_file.name}"
            + ("" if base_file else " (its log lost the final estimate)")
            + (f": {n_clamped} targets clamped, so too low" if n_clamped else "")
        )
    res.ppl_ours = float(np.exp(nll.mean()))
    # as llama-perplexity --kl-divergence: terms where llama.cpp's log p > -16 (the file's
    # clamped tail would otherwise add ~1e-4 of rounding on a wide random distribution)
    keep = base.logp > -16
    kld = np.where(keep, np.exp(base.logp) * (base.logp - ours), 0.0).sum(-1)
    res.kld_mean, res.kld_max = float(kld.mean()), float(kld.max())
    res.top1 = float((base.logp.argmax(-1) == ours.argmax(-1)).mean())
    top = np.argsort(-base.logp, -1)[..., :10]
    d = np.abs(np.take_along_axis(base.logp, top, -1) - np.take_along_axis(ours, top, -1))
    d[np.take_along_axis(base.clamped, top, -1)] = 0.0
    res.dlogp_max = float(d.max())
    return res


def use_ggml_gelu() -> None:
    """Diagnostic: make our GELU round as ggml's CPU one does (input to f16, output read from an
    f16 table, |x| >= 10 passed through), to tell that known ~1e-3 difference from real ones."""
    from engine import ops

    plain = ops.gated_act

    def gated_act(act: str, g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
        if act != "gelu":
            return plain(act, g, u, out)
        x = g.astype(np.float16).astype(np.float32)
        y = (
            0.5
            * x
            * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * x * (1 + np.float32(0.044715) * x * x)))
        )
        y = y.astype(np.float16).astype(np.float32)
        y = np.where(g <= -10, 0, np.where(g >= 10, g, y))
        out[:] = y * u

    ops.gated_act = gated_act


def _q8_0_round(x: np.ndarray) -> np.ndarray:
    """x rounded as ggml-cpu's x86 quantize_row_q8_0 (and q8_1) store it: blocks of 32,
    id = 127/amax in float32 (not 1/d), round half to even, d kept as f16."""
    b = np.ascontiguousarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(b).max(1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    return (np.rint(b * inv) * d).reshape(x.shape)


def _q8_k_round(x: np.ndarray) -> np.ndarray:
    """x rounded as quantize_row_q8_K: blocks of 256, scale -127/max by the element of largest
    magnitude (signed), q capped at 127, d = 1/scale in float32."""
    b = np.ascontiguousarray(x, np.float32).reshape(-1, 256)
    big = np.take_along_axis(b, np.abs(b).argmax(1)[:, None], 1)
    with np.errstate(divide="ignore"):
        iscale = np.where(big != 0, np.float32(-127) / big, np.float32(0)).astype(np.float32)
        d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.float32(127), np.rint(b * iscale))
    return (q * d).reshape(x.shape)


def use_ggml_q8_activations() -> None:
    """Diagnostic: round the input of every matmul as llama.cpp's CPU dot product does for the
    weight's type (its vec_dot_type: Q8_0/Q8_1 for the 32-blocks, Q8_K for the k-quants and
    IQ4_XS, f16 for F16 weights), so what remains is summation order."""
    import importlib
    import pkgutil

    from gguf import GGMLQuantizationType as T

    import engine.models
    from engine import quants

    by_8_0 = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL, T.MXFP4}
    by_8_k = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS}
    plain = quants.matmul

    def q8(w, x: np.ndarray) -> np.ndarray:
        if w.qtype in by_8_0:
            return _q8_0_round(x)
        if w.qtype in by_8_k:
            return _q8_k_round(x)
        if w.qtype == T.F16:
            return x.astype(np.float16).astype(np.float32)
        return x

    def matmul(w, x, out, scratch=None):
        plain(w, q8(w, x), out, scratch)

    def matmul_many(ws, x, outs, scratch=None):
        for w, o in zip(ws, outs, strict=True):
            plain(w, q8(w, x), o, scratch)

    # every model module that imported them (layers, moe, ...)
    for info in pkgutil.iter_modules(engine.models.__path__):
        mod = importlib.import_module(f"engine.models.{info.name}")
        if getattr(mod, "matmul", None) is plain:
            mod.matmul = matmul  # type: ignore[attr-defined]
        if getattr(mod, "matmul_many", None) is quants.matmul_many:
            mod.matmul_many = matmul_many  # type: ignore[attr-defined]


def use_ggml_f16_attention() -> None:
    """Diagnostic (prefill path): with an f16 KV cache and flash attention off, ggml multiplies
    f16 K by the queries rounded to f16, and f16 V by the softmax rounded to f16 (the f16
    matmul's vec_dot_type); do the same in our chunk attention."""
    from engine import ops

    def attention_chunk(q, kf, vf, pos, window, scale, softcap, out, sinks=None) -> None:
        f16 = np.float16
        m, H, D = q.shape
        L, G, _ = kf.shape
        rep = H // G
        kpos = np.arange(L)
        mask = kpos[None, :] > pos[:, None]
        if window > 0:
            mask |= kpos[None, :] <= (pos[:, None] - window)
        q16 = q.astype(f16).astype(np.float32)
        for g in range(G):
            s = (
                q16[:, g * rep : (g + 1) * rep].transpose(1, 0, 2).reshape(rep * m, D)
                @ kf[:, g].T
                * scale
            )
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            s = s.reshape(rep, m, L) + np.where(mask, -np.inf, 0).astype(np.float32)[None]
            mx = s.max(2, keepdims=True)
            if sinks is not None:  # gpt-oss: one more logit per head in the softmax, no value
                sk = sinks[g * rep : (g + 1) * rep, None, None]
                mx = np.maximum(mx, sk)
            s = np.exp(s - mx)
            tot = s.sum(2, keepdims=True) + (np.exp(sk - mx) if sinks is not None else 0)
            s = (s / tot).astype(f16).astype(np.float32)
            out[:, g * rep : (g + 1) * rep] = (
                (s.reshape(rep * m, L) @ vf[:, g]).reshape(rep, m, -1).transpose(1, 0, 2)
            )

    ops.attention_chunk = attention_chunk


def rename_in_place(path: Path, name: str) -> None:
    """Overwrite general.name's value with `name`, of the same length (the header stays valid)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields["general.name"]
    old = bytes(field.parts[field.data[0]])
    if len(old) != len(name.encode()):
        raise ValueError(f"rename: '{name}' must have the length of '{old.decode()}'")
    off = int(field.offset) + sum(p.nbytes for p in field.parts[: field.data[0]])
    with open(path, "r+b") as f:
        f.seek(off)
        assert f.read(len(old)) == old
        f.seek(off)
        f.write(name.encode())


def tiny_cases(
    archs: list[str],
    qtypes: list[str],
    contexts: list[int] | None,
    work: Path,
    extra: dict[str, object] | None = None,
):
    """(case name, model path, n_ctx) for each arch x weight type x context; generator errors
    become cases with a path of None and the message as the name's tail."""
    from gguf import GGMLQuantizationType

    for arch in archs:
        gen = GENERATORS.get(arch)
        for qt in qtypes:
            if gen is None:
                yield f"{arch} {qt}", None, 0, f"no generator for '{arch}' in GENERATORS"
                continue
            path = work / f"tiny-{arch}-{qt}.gguf"
            try:
                fn = getattr(importlib.import_module(gen.module), gen.function)
                kw = dict(gen.kwargs, qtype=GGMLQuantizationType[qt], **(extra or {}))
                if gen.pass_arch:
                    kw["arch"] = gen.arch or arch
                path = fn(path, **kw)
                if gen.rename:
                    rename_in_place(path, gen.rename)
            except Exception as e:
                yield (
                    f"{arch} {qt}",
                    None,
                    0,
                    f"generator {gen.module}.{gen.function}: {type(e).__name__}: {e}",
                )
                continue
            for c in contexts or gen.contexts:
                yield f"{arch} {qt} c{c}", path, c, ""


def gen_value(text: str) -> object:
    """A --gen value: a weight type's name (expert_qtype=MXFP4), else JSON."""
    from gguf import GGMLQuantizationType

    if text in GGMLQuantizationType.__members__:
        return GGMLQuantizationType[text]
    return json.loads(text)


def fmt(r: Result) -> str:
    if r.error:
        return f"{r.case:<24} ERROR {r.error}"
    rel = r.ppl_ours / r.ppl_llama - 1
    tok = {True: "same", False: "DIFF", None: "?"}[r.same_tokens]
    shape = f"{r.n_chunk:>3}x{r.n_scored // max(r.n_chunk, 1):<4}"
    return (
        f"{r.case:<24} {shape} {r.ppl_llama:>14.6g} {r.ppl_ours:>14.6g} "
        f"{rel:>+10.2e} {r.kld_mean:>9.2e} {r.kld_max:>9.2e} {100 * r.top1:>7.2f} {r.dlogp_max:>9.2e}  {tok}"
        + (f"  [{r.note}]" if r.note else "")
    )


HEADER = (
    f"{'case':<24} {'chunks':<8} {'PPL llama.cpp':>14} {'PPL ours':>14} {'rel diff':>10} "
    f"{'KLD mean':>9} {'KLD max':>9} {'top1 %':>7} {'max|dlp|':>9}  tokens"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--arch", nargs="*", default=[], help=f"tiny models to check ({', '.join(GENERATORS)})"
    )
    ap.add_argument(
        "--model", nargs="*", default=[], type=Path, help="GGUF files to check as they are"
    )
    ap.add_argument(
        "--base",
        type=Path,
        help="with --model: compare with this existing --kl-divergence-base file (e.g. llama.cpp "
        "on the F32 model) instead of running llama.cpp on each model",
    )
    ap.add_argument(
        "--qtype", nargs="+", default=["F32", "Q8_0"], help="weight types of the tiny models"
    )
    ap.add_argument(
        "-c",
        "--ctx",
        nargs="+",
        type=int,
        help="context sizes (default: per generator; 128 for --model)",
    )
    ap.add_argument(
        "--gen",
        nargs="*",
        default=[],
        metavar="KEY=JSON",
        help="extra generator arguments (JSON or a weight type's name), e.g. n_embd=256 n_ff=512 "
        "(IQ4_XS needs rows of 256) or expert_qtype=MXFP4",
    )
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument(
        "-f", "--file", type=Path, default=TEXT, help="text (default: tests/data/gpl-3.txt)"
    )
    ap.add_argument(
        "--kv", default="f16", choices=["f16", "f32"], help="KV cache type on both sides"
    )
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument(
        "--work", type=Path, help="where models and logit files go (default: a temp dir)"
    )
    ap.add_argument(
        "--no-pad-ctx",
        dest="pad_ctx",
        action="store_false",
        help="our context of exactly -c positions (llama.cpp rounds it up to a multiple of 256)",
    )
    ap.add_argument(
        "--ggml-gelu",
        action="store_true",
        help="diagnostic: round our GELU as ggml's CPU table does",
    )
    ap.add_argument(
        "--ggml-q8",
        action="store_true",
        help="diagnostic: round matmul inputs to Q8_0/Q8_K/f16 by weight type, as ggml's CPU kernels do",
    )
    ap.add_argument(
        "--ggml-f16-attn",
        action="store_true",
        help="diagnostic: round queries and attention weights to f16 as ggml does with an f16 cache",
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if not (LLAMA_BIN / "llama-perplexity").exists():
        ap.error(f"no llama-perplexity in {LLAMA_BIN} (set LLAMA_CPP_BIN)")
    if args.ggml_gelu:
        use_ggml_gelu()
    if args.ggml_f16_attn:
        use_ggml_f16_attention()
    if args.ggml_q8:
        use_ggml_q8_activations()
    work = args.work or Path(tempfile.mkdtemp(prefix="xcheck-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    print(HEADER, flush=True)
    extra = {k: gen_value(v) for k, v in (kv.split("=", 1) for kv in args.gen)}
    cases = list(tiny_cases(args.arch, args.qtype, args.ctx, work, extra))
    if args.base:
        args.ctx = [read_kld_base(args.base).n_ctx]
    cases += [(m.name + f" c{c}", m, c, "") for m in args.model for c in (args.ctx or [128])]
    for name, path, n_ctx, err in cases:
        r = (
            Result(name, error=err)
            if err
            else compare(
                name,
                path,
                args.file,
                n_ctx,
                args.chunks,
                work,
                args.kv,
                args.threads,
                args.pad_ctx,
                args.base,
            )
        )
        results.append(r)
        print(fmt(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
