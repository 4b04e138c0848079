"""Accuracy of the decode paths against llama.cpp's reference data (not collected by pytest):

    python tests/compare_int8_accuracy.py [smollm2] [gemma3]

For each starter model, the teacher-forced greedy comparison of tests/test_reference_models.py
(mean/max error of llama.cpp's top-10 log-probabilities, greedy flips above a 0.1 margin) with
every weight product computed by:
  float-prefill: the default prefill (dequantise + BLAS, float32 activations)
  float-decode:  the float mat-vec for every token (GGSTATION_NO_INT8's decode path)
  int8-decode:   the int8 mat-vec for every token (llama.cpp's formulation: Q8 activations)
The two decode rows run the prompt in ubatches of MATVEC_MAX_TOKENS, which compute each token
as decode does. Measured: smollm2 0.0939/0.948/4 flips (float-prefill), 0.0939/0.951/4
(float-decode), 0.0978/1.088/3 (int8-decode); gemma3 0.1212/1.001/1, 0.1212/1.001/1,
0.1430/1.593/5. llama.cpp against itself (flash attention on/off): 0.098/0.87/1 and 0.139/1.26/4
(tests/test_reference_models.py): at this scale 8-bit rounding flips dominate either way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import quants  # noqa: E402
from engine.batch import Batch  # noqa: E402
from engine.context import Context, ContextParams  # noqa: E402
from engine.hub import store as model_store
from engine.model import load_model  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
MODELS = {"smollm2": "smollm2", "gemma3": "gemma3-270m"}


def _log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(model, ref, n_ubatch: int, decode_path: str) -> tuple[float, float, int, int]:
    ctx = Context(model, ContextParams(n_ctx=256, n_ubatch=n_ubatch, decode_path=decode_path))
    errs, flips, n_steps = [], 0, 0
    for r in ref["results"]:
        ids = r["prompt_ids"] + [s["id"] for s in r["steps"]]
        n = len(r["prompt_ids"])
        ctx.kv.clear()
        logits = ctx.decode(Batch.for_sequence(ids[: n + len(r["steps"]) - 1], 0, logits_all=True))
        lp = _log_softmax(logits[n - 1 :])
        for i, st in enumerate(r["steps"]):
            top = st["top_logprobs"]
            errs += [abs(lp[i, t["id"]] - t["logprob"]) for t in top]
            if top[0]["logprob"] - top[1]["logprob"] > 0.1 and int(np.argmax(lp[i])) != st["id"]:
                flips += 1
            n_steps += 1
    return float(np.mean(errs)), float(np.max(errs)), flips, n_steps


def main(names: list[str]) -> None:
    modes = {
        "float-prefill": (False, 512),
        "float-decode": (False, quants.MATVEC_MAX_TOKENS),
        "int8-decode": (True, quants.MATVEC_MAX_TOKENS),
    }
    for name in names or list(MODELS):
        model = load_model(model_store.ensure(MODELS[name]))
        ref = json.loads((DATA / f"greedy-{name}.json").read_text(encoding="utf-8"))
        for mode, (int8, n_ubatch) in modes.items():
            mean, mx, flips, n = compare(model, ref, n_ubatch, "int8" if int8 else "float")
            print(
                f"{name:8s} {mode:14s} top-10 log-prob error mean {mean:.4f} max {mx:.3f}, "
                f"greedy flips {flips}/{n}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
