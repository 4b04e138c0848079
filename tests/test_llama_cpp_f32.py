"""The forward pass against llama.cpp itself where both compute in plain float.

llama.cpp rounds activations to 8 bits before quantised matmuls and, with flash attention,
accumulates attention in f16; both move log-probabilities by ~0.1, which hides how close the
architectures are. On the same model with every tensor dequantised to F32 neither happens,
so our log-probabilities must equal llama.cpp's (tests/data: produced by llama-cpp-python).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.model import load_model


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_f32_logprobs_equal_llama_cpp(request, name, tmp_path, reference_dir):
    from ggufgen import dequantize_to_f32

    src = request.getfixturevalue(f"{name}_path")
    model = load_model(dequantize_to_f32(src, tmp_path / f"{name}-f32.gguf"))
    ref = json.loads((reference_dir / f"llama_cpp_f32_{name}.json").read_text(encoding="utf-8"))
    ctx = Context(model, ContextParams(n_ctx=256))
    errs, flips = [], 0
    for r in ref["results"]:
        ids = r["prompt_ids"] + r["token_ids"][:-1]
        n = len(r["prompt_ids"])
        ctx.kv.clear()
        lg = ctx.decode(Batch.for_sequence(ids, 0, logits_all=True)).astype(np.float64)[n - 1 :]
        lp = lg - lg.max(1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(1, keepdims=True))
        for i, st in enumerate(r["steps"]):
            errs += list(np.abs(lp[i, st["top_ids"]] - st["top_logprobs"]))
            margin = st["top_logprobs"][0] - st["top_logprobs"][1]
            flips += margin > 0.05 and int(np.argmax(lp[i])) != st["top_ids"][0]
    assert flips == 0
    assert np.mean(errs) < 0.005 and np.max(errs) < 0.03, (np.mean(errs), np.max(errs))
