"""Per-token cost of a grammar mask (not collected by pytest: the name does not start with test_).

    python tests/bench_grammar.py [MODEL.gguf] [--tokens N]

On the model's real vocabulary (SmolLM2-135M: 49152 tokens by default) it prints the one-off
costs (building llguidance's vocabulary, compiling a grammar, creating a matcher) and, per
generated token: the masked logits (llguidance's bitmask, unpacked, and the select: what a
step pays), advancing the matcher, and the whole SequenceGenerator.accept() against the same
call without a grammar. Logits are random and sampled at temperature 1, so the grammars are
walked through varied states; JSON output is validated at the end. Wall times; median and
p95 over the steps (p95 is mostly other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import grammar as grammar_mod  # noqa: E402
from engine.gguf_file import GGUFFile  # noqa: E402
from engine.grammar import Grammar, GrammarMatcher, vocabulary_for  # noqa: E402
from engine.hub import store as model_store  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.sequence import SequenceGenerator  # noqa: E402
from engine.tokenizer import load_tokenizer  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
    },
    "required": ["name", "age", "tags", "address"],
}
GRAMMARS = {
    "gbnf a{5}": lambda: Grammar.from_gbnf('root ::= "a"{5}'),
    "gbnf words": lambda: Grammar.from_gbnf(
        'root ::= word (" " word){0,60} "."\nword ::= [a-z]{1,10}'
    ),
    "json object": lambda: Grammar.from_json_schema({"type": "object"}),
    "json schema": lambda: Grammar.from_json_schema(SCHEMA),
}
PARAMS = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)


def ms(xs: list[float]) -> str:
    a = np.asarray(xs) * 1e3
    return f"{np.median(a):7.3f} / {np.percentile(a, 95):7.3f}"


def bench_parts(g: Grammar, tok, n_vocab: int, n_tokens: int, rng) -> dict[str, list[float]]:
    """The masked logits (llguidance's mask + the select) and the matcher's advance, timed
    apart; tokens drawn uniformly among the allowed ones."""
    m = GrammarMatcher(g, tok)
    t: dict[str, list[float]] = {"mask": [], "accept": []}
    logits = rng.normal(0, 3, n_vocab).astype(np.float32)
    for _ in range(n_tokens):
        t0 = time.perf_counter()
        masked = m.apply(logits)
        t1 = time.perf_counter()
        ids = np.flatnonzero(masked > -np.inf)
        token = int(ids[rng.integers(ids.size)])
        t2 = time.perf_counter()
        m.accept(token)
        t3 = time.perf_counter()
        t["mask"].append(t1 - t0)
        t["accept"].append(t3 - t2)
        if m.stopped:
            m = GrammarMatcher(g, tok)  # start over: keep measuring live states
    return t


def bench_steps(
    g: Grammar | None, tok, n_vocab: int, n_tokens: int, rng
) -> tuple[list[float], list[str]]:
    """Whole SequenceGenerator.accept() steps; restarts the sequence when it finishes."""
    times, texts = [], []
    gen = SequenceGenerator(tok, PARAMS, -1, grammar=g)
    for _ in range(n_tokens):
        logits = rng.normal(0, 3, n_vocab).astype(np.float32)
        t0 = time.perf_counter()
        step = gen.accept(logits)
        times.append(time.perf_counter() - t0)
        if step.finish_reason:
            texts.append(gen.text)
            gen = SequenceGenerator(tok, PARAMS, -1, grammar=g)
    return times, texts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", help="GGUF file (default: the SmolLM2 starter model)")
    ap.add_argument("--tokens", type=int, default=400, help="generated tokens per grammar")
    args = ap.parse_args()
    path = args.model or str(model_store.ensure("smollm2"))
    tok = load_tokenizer(GGUFFile(path))
    n_vocab = tok.n_vocab
    rng = np.random.default_rng(0)
    print(
        f"{Path(path).name}: n_vocab {n_vocab}, {args.tokens} tokens per grammar; ms median / p95\n"
    )

    t0 = time.perf_counter()
    grammar_mod.token_bytes(tok)
    t1 = time.perf_counter()
    vocabulary_for(tok)
    t2 = time.perf_counter()
    print(
        f"one-off: token bytes {1e3 * (t1 - t0):.0f} ms, llguidance vocabulary (incl. bytes) "
        f"{1e3 * (t2 - t1):.0f} ms (cached per tokenizer)\n"
    )

    plain, _ = bench_steps(None, tok, n_vocab, args.tokens, rng)
    print(
        f"{'grammar':<12} {'compile':>8} {'matcher':>8} | {'masked logits':>17} {'accept':>17} |"
        f" {'step':>17} {'step - plain':>12}"
    )
    for name, make in GRAMMARS.items():
        t0 = time.perf_counter()
        g = make()
        t1 = time.perf_counter()
        GrammarMatcher(g, tok)
        t2 = time.perf_counter()
        parts = bench_parts(g, tok, n_vocab, args.tokens, rng)
        steps, texts = bench_steps(g, tok, n_vocab, args.tokens, rng)
        if g.kind == "json_schema":
            for text in texts:
                json.loads(text)
        extra = (np.median(steps) - np.median(plain)) * 1e3
        print(
            f"{name:<12} {1e3 * (t1 - t0):7.2f}  {1e3 * (t2 - t1):7.2f}  | {ms(parts['mask'])} "
            f"{ms(parts['accept'])} | {ms(steps)} {extra:+9.3f} ms"
        )
    print(f"{'(none)':<12} {'':>8} {'':>8} | {'':>17} {'':>17} | {ms(plain)}")


if __name__ == "__main__":
    main()
