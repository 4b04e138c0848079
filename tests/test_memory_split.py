"""The memory estimate split across devices (-ngl, issue 15): which layers, how much KV cache and
how much compute scratch land on the GPU, and the VRAM verdict, on tiny generated models."""

from __future__ import annotations

import pytest

from engine.backends import CPU, DeviceInfo, gpu_placement
from engine.buffers import compute_buffer_bytes
from engine.kv_cache import KVCache
from engine.memory import (
    DeviceFit,
    device_fits,
    estimate_memory,
    memory_fit,
)
from engine.model_info import inspect_model

N_CTX, N_SEQ = 256, 2


@pytest.fixture(scope="module", params=["llama", "gemma3", "olmo2"])
def info(request, tiny_model_dir):
    """llama and gemma3 tie the output to token_embd; olmo2 has its own output.weight."""
    from ggufgen import write_tiny_model

    path = write_tiny_model(tiny_model_dir / f"split-{request.param}.gguf", arch=request.param)
    got = inspect_model(path)
    assert got.ok, got.error
    return got


def _split(info, n_gpu_layers: int):
    est = info.estimate(n_ctx=N_CTX, n_seq_max=N_SEQ, n_gpu_layers=n_gpu_layers)
    return est, {d.device: d for d in est.devices}


def _layer_tensor_bytes(info, layers) -> int:
    from engine.gguf_split import open_gguf

    f = open_gguf(info.path)
    try:
        return sum(
            t.nbytes
            for t in f.tensors.values()
            if any(t.name.startswith(f"blk.{il}.") for il in layers)
        )
    finally:
        f.close()


def test_estimate_split_none_offloaded_is_the_cpu_alone(info):
    est, dev = _split(info, 0)
    assert list(dev) == [CPU]
    assert (dev[CPU].weights_bytes, dev[CPU].kv_bytes, dev[CPU].compute_bytes) == (
        info.weights_bytes,
        est.kv_bytes,
        est.compute_bytes,
    )
    assert dev[CPU].n_layers == info.n_layer


@pytest.mark.parametrize("ngl", [1, 2, "n_layer", "n_layer+1", 100, -1])
def test_estimate_split_places_the_last_layers_on_the_gpu(info, ngl):
    # llama.cpp's rule: the head counts as layer n_layer, the last N of 0..n_layer go to the GPU
    n_layer, cfg = info.n_layer, info.cfg
    n_gpu_layers = {"n_layer": n_layer, "n_layer+1": n_layer + 1}.get(ngl, ngl)
    est, dev = _split(info, n_gpu_layers)
    on_gpu = n_layer if n_gpu_layers < 0 else min(n_gpu_layers - 1, n_layer)
    head = True
    cpu, gpu = dev[CPU], dev["GL0"]
    assert list(dev) == [CPU, "GL0"]
    assert (cpu.n_layers, gpu.n_layers) == (n_layer - on_gpu, on_gpu)

    # weights: the last layers' tensors as the file has them, plus the head past n_layer
    gpu_layers = range(n_layer - on_gpu, n_layer)
    expect = _layer_tensor_bytes(info, gpu_layers) + (info.output_weights_bytes if head else 0)
    assert gpu.weights_bytes == expect
    tied = info.output_tied_bytes if head else 0  # the CPU keeps token_embd for the lookup
    assert cpu.weights_bytes + gpu.weights_bytes == info.weights_bytes + tied

    # KV: exactly the arrays the cache allocates for those layers (sliding layers included)
    kv = KVCache(cfg, N_CTX // N_SEQ, N_SEQ)
    assert gpu.kv_bytes == sum(kv.k[il].nbytes + kv.v[il].nbytes for il in gpu_layers)
    assert cpu.kv_bytes + gpu.kv_bytes == kv.nbytes == est.kv_bytes

    # one compute scratch each, of the CPU's size
    scratch = compute_buffer_bytes(cfg, 512, N_CTX // N_SEQ)
    assert cpu.compute_bytes == gpu.compute_bytes == scratch

    # the top-level figures stay the sums over the devices
    assert est.weights_bytes == cpu.weights_bytes + gpu.weights_bytes
    assert est.kv_bytes == cpu.kv_bytes + gpu.kv_bytes
    assert est.compute_bytes == 2 * scratch
    assert (
        est.host_bytes == est.total_bytes - gpu.total_bytes == cpu.total_bytes + est.metadata_bytes
    )


def test_estimate_split_tied_output_head(info):
    """The head is output_norm plus output.weight, or the token embedding standing in for it."""
    if info.arch == "olmo2":
        assert info.output_tied_bytes == 0 and info.output_weights_bytes > 0
    else:
        assert info.output_tied_bytes > 0 and info.output_weights_bytes > info.output_tied_bytes


def test_estimate_split_names_the_device(info):
    _est, dev = _split(info, 0)
    est = info.estimate(n_ctx=N_CTX, n_gpu_layers=1, gpu_device="GL1")
    assert [d.device for d in est.devices] == [CPU, "GL1"]


def test_estimate_split_needs_the_layer_bytes(info):
    with pytest.raises(ValueError, match="each layer's weight bytes"):
        estimate_memory(info.cfg, info.weights_bytes, info.n_tensors, n_gpu_layers=1)
    with pytest.raises(ValueError, match="got 1"):
        estimate_memory(
            info.cfg, info.weights_bytes, info.n_tensors, n_gpu_layers=1, layer_weights_bytes=[1]
        )


def test_ram_fit_counts_only_the_cpu_share(info):
    cpu_only, _ = _split(info, 0)
    offloaded, dev = _split(info, info.n_layer)
    assert memory_fit(cpu_only, (1 << 40, 0)).needed_bytes == cpu_only.total_bytes
    assert (
        memory_fit(offloaded, (1 << 40, 0)).needed_bytes
        == dev[CPU].total_bytes + offloaded.metadata_bytes
    )


def _gl0(free: int | None, total: int | None = 8 << 30) -> DeviceInfo:
    return DeviceInfo(
        "GL0",
        "OpenGL",
        "llvmpipe (LLVM 15.0.7, 256 bits) (4.5 (Core Profile) Mesa)",
        total,
        free,
        ("GL 4.5", "compute"),
    )


def test_vram_verdict_against_free_memory(info):
    est, dev = _split(info, info.n_layer + 1)
    need = dev["GL0"].total_bytes
    cpu = DeviceInfo(CPU, "CPU", "x", 1 << 40, 1 << 40)
    assert device_fits(_split(info, 0)[0], [cpu, _gl0(need)]) == []  # nothing offloaded
    (fit,) = device_fits(est, [cpu, _gl0(2 * need)])
    assert (fit.device, fit.needed_bytes, fit.verdict) == ("GL0", need, "fits")
    assert device_fits(est, [_gl0(need)])[0].verdict == "tight"
    assert device_fits(est, [_gl0(need - 1)])[0].verdict == "too big"
    assert "too big" in device_fits(est, [_gl0(need - 1)])[0].summary()


def test_vram_verdict_when_the_driver_does_not_say():
    assert DeviceFit("GL0", 100, None, 99).verdict == "too big"  # the total stands in for free
    assert DeviceFit("GL0", 100, None, 1000).verdict == "fits"
    unknown = DeviceFit("GL0", 100, None, None)
    assert unknown.verdict == "unknown" and "not reported" in unknown.summary()
    assert "free not reported" in DeviceFit("GL0", 100, None, 1000).summary()


def test_vram_verdict_for_a_device_not_listed(info):
    est, _ = _split(info, 1)
    (fit,) = device_fits(est, [])
    assert fit.verdict == "unknown"


def test_estimate_split_takes_the_last_layers_not_the_first(info):
    sizes = [1000 * (il + 1) for il in range(info.n_layer)]  # every layer a different size
    est = estimate_memory(
        info.cfg,
        sum(sizes) + 7,
        info.n_tensors,
        n_gpu_layers=2,
        layer_weights_bytes=sizes,
        output_weights_bytes=7,
    )
    assert [d.weights_bytes for d in est.devices] == [sum(sizes[:-1]), sizes[-1] + 7]


def test_gpu_placement_is_llama_cpp_s():
    # llama_model::load_tensors: i_gpu_start = max(n_layer + 1 - ngl, 0), the head is layer n_layer
    assert gpu_placement(30, 0) == (30, False)
    assert gpu_placement(30, 1) == (30, True)  # the head alone
    assert gpu_placement(30, 2) == (29, True)
    assert gpu_placement(30, 31) == gpu_placement(30, 99) == gpu_placement(30, -1) == (0, True)


@pytest.fixture
def fake_gl0(monkeypatch):
    """engine.backends lists a GL0 with 8 GiB, 6 GiB free (the OpenGL backend is another's)."""
    import engine.backends as backends

    monkeypatch.setattr(backends, "_gpu_devices", lambda: [_gl0(6 << 30)])
    backends.list_devices(refresh=True)
    yield
    monkeypatch.undo()
    backends.list_devices(refresh=True)


def test_info_prints_the_split_with_ngl(tiny_llama_path, fake_gl0, capsys):
    import json

    from engine.cli import main

    assert (
        main(["info", "-m", str(tiny_llama_path), "-c", "128", "-ngl", "2"]) == 0
    )  # of 2 layers + output
    out = capsys.readouterr().out
    lines = {ln.split(None, 2)[1]: ln for ln in out.splitlines() if ln.startswith("  on ")}
    assert list(lines) == [CPU, "GL0"]
    assert " 1 layer: weights " in lines[CPU] and " 1 layer + output: weights " in lines["GL0"]
    assert "GL0 needs" in out and "6.0 GiB free: fits" in out
    assert main(["info", "-m", str(tiny_llama_path), "-c", "128", "-ngl", "-1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    devices = d["memory_estimate"]["devices"]
    assert [x["device"] for x in devices] == [CPU, "GL0"] and devices[1]["n_layers"] == 2
    assert d["gpu_fit"][0]["verdict"] == "fits"
    assert main(["info", "-m", str(tiny_llama_path), "-c", "128"]) == 0
    assert "on GL0" not in capsys.readouterr().out  # no -ngl: the CPU alone


def test_info_ngl_without_a_gpu_says_so(tiny_llama_path, capsys):
    from engine.cli import main

    assert main(["info", "-m", str(tiny_llama_path), "-c", "128", "-ngl", "2", "-dev", "GL7"]) == 0
    assert "-ngl 2 ignored" in capsys.readouterr().out
