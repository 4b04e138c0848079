"""The values widgets see, built from engine objects."""

from __future__ import annotations

from app.dto import DeviceShare, LlmFileInfo, MemoryFigures
from engine import MemoryReport
from engine.backends import DeviceMemory


def test_memory_figures_from_engine_report():
    report = MemoryReport(
        weights_bytes=10,
        weights_resident_bytes=None,
        kv_bytes=4,
        kv_used_bytes=3,
        kv_per_seq_used=[1, 2],
        estimate=True,
    )
    fig = MemoryFigures.from_report(report)
    assert fig.weights_resident_bytes == 0 and fig.rss_bytes == 0
    assert fig.kv_per_seq_used == (1, 2) and fig.total_bytes == report.total_bytes == 14


def test_memory_figures_carry_the_devices_shares():
    report = MemoryReport(
        weights_bytes=10,
        weights_resident_bytes=None,
        kv_bytes=4,
        kv_used_bytes=0,
        compute_bytes=6,
        devices=(DeviceMemory("CPU", 7, 1, 3, 1), DeviceMemory("GL0", 3, 3, 3, 3)),
    )
    fig = MemoryFigures.from_report(report)
    assert fig.devices == (DeviceShare("CPU", 7, 1, 3, 1), DeviceShare("GL0", 3, 3, 3, 3))
    assert fig.gpu_shares == (fig.devices[1],) and fig.host_bytes == fig.total_bytes - 9 == 11
    given = (DeviceShare("CPU", 1, 1, 1, 0),)
    assert MemoryFigures.from_report(report, given).devices == given


def test_llm_file_info_main_quant_falls_back_to_the_biggest_type():
    assert LlmFileInfo("/a", "a", quant_mix={"Q4_1": 60, "F32": 30}).main_quant == "Q4_1"
    assert LlmFileInfo("/a", "a", quant="Q4_K_M", quant_mix={"F32": 1}).main_quant == "Q4_K_M"
    assert LlmFileInfo("/a", "a").main_quant == "?"
