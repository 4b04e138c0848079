"""The generated kernel modules (engine/quants/generated/) against their generator, and the
cache policy that keeps numba from running kernels built from older sources (engine/jit.py)."""

from __future__ import annotations

import types

import pytest
from gguf import GGMLQuantizationType

from engine import jit, quants
from engine.quants import codegen, generated

REGENERATE = "run `python -m engine.quants.codegen` and commit engine/quants/generated/"


def _texts(directory):
    # Line endings normalised, as in jit.source_digest: a CRLF checkout is not out of date.
    return {p.name: p.read_bytes().replace(b"\r\n", b"\n") for p in directory.glob("*.py")}


def test_generated_modules_match_generator(tmp_path):
    codegen.write(tmp_path)
    want, have = _texts(tmp_path), _texts(codegen.GENERATED)
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    differ = sorted(n for n in want.keys() & have.keys() if want[n] != have[n])
    assert not (missing or extra or differ), (
        f"engine/quants/generated/ is out of date (missing {missing}, not generated {extra}, "
        f"different {differ}): {REGENERATE}"
    )


@pytest.mark.parametrize("spec", codegen.TYPES, ids=lambda s: s.name)
def test_entry_points_named_by_type(spec):
    """matvec_q4_k & co. are what QUANT_TYPES dispatches to (grep q4_k finds the whole path)."""
    qt = quants.QUANT_TYPES[GGMLQuantizationType[spec.name]]  # imports the type's module
    mod = getattr(generated, spec.t)
    for f in codegen.FAMILIES:
        for op in f.ops:
            # dense types: no int8 path; types without a row-interleaved form: no _rp kernels
            if f.int8 and not spec.vec_dot or f.rp and not spec.rp:
                assert getattr(qt, op) is None and not hasattr(mod, f"{op}_{spec.t}")
            else:
                assert getattr(qt, op) is getattr(mod, f"{op}_{spec.t}")
    for body in ("matvec", "matvec_multi", "dequant"):
        assert hasattr(getattr(mod, f"_{body}_{spec.t}"), "py_func")  # an njit kernel


def test_source_digest_ignores_line_endings(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_bytes(b"x = 1\ny = 2\n")
    b.write_bytes(b"x = 1\r\ny = 2\r\n")
    assert jit.source_digest([a]) == jit.source_digest([b])
    a.write_bytes(b"x = 1\ny = 3\n")
    assert jit.source_digest([a]) != jit.source_digest([b])


def test_stale_generated_module_compiles_uncached(tmp_path, monkeypatch):
    src = tmp_path / "layout.py"
    src.write_text("block_bytes = 18\n")
    dep = types.SimpleNamespace(__file__=str(src), __name__="layout")
    digest = jit.source_digest([src])
    assert jit.generated_kernel("gen.py", (dep,), digest) is jit.parallel_kernel
    assert jit.generated_kernel("gen.py", (dep,), digest, parallel=False) is jit.kernel

    src.write_text("block_bytes = 20\n")  # edited, not regenerated
    monkeypatch.setattr(jit, "_stale_warned", False)
    with pytest.warns(RuntimeWarning, match="engine.quants.codegen"):
        decorate = jit.generated_kernel("gen.py", (dep,), digest, parallel=False)
    add_one = decorate(lambda a: a + 1)
    assert add_one(1) == 2
    assert type(add_one._cache).__name__ == "NullCache"  # compiled, never saved or loaded


def test_sources_missing_means_trusted():
    """A frozen bundle ships no sources beside the code: nothing can have drifted."""
    dep = types.SimpleNamespace(__file__="/nonexistent/_ir.py", __name__="_ir")
    assert jit.generated_kernel("gen.py", (dep,), "0" * 16) is jit.parallel_kernel


def test_quant_types_import_each_module_once_and_take_plain_ints():
    """QUANT_TYPES imports a type's module on first use: the same entry every time, by the
    enum or by its number; a type without a module is a KeyError (None from .get)."""
    qt = quants.QUANT_TYPES[GGMLQuantizationType.Q4_K]
    assert quants.QUANT_TYPES[int(GGMLQuantizationType.Q4_K)] is qt
    assert qt.qtype == GGMLQuantizationType.Q4_K and GGMLQuantizationType.Q4_K in quants.QUANT_TYPES
    assert quants.QUANT_TYPES.get(GGMLQuantizationType.TQ1_0) is None
    assert quants.QUANT_TYPES.get(GGMLQuantizationType.TQ1_0, qt) is qt
    assert quants.QUANT_TYPES.get(GGMLQuantizationType.Q4_K) is qt
    assert len(quants.QUANT_TYPES) == len(codegen.TYPES) and set(quants.INTERLEAVED_TYPES) == {
        GGMLQuantizationType[s.name] for s in codegen.TYPES if s.rp
    }
