"""app/format.py: byte sizes and the one-line reply summary."""

from __future__ import annotations

from app.format import human_bytes, reply_summary


def test_format_helpers():
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(12) == "12 B"
    line = reply_summary(
        {
            "n_prompt": 10,
            "n_generated": 20,
            "t_prompt_ms": 100,
            "t_gen_ms": 1000,
            "ttft_ms": 120,
            "replay": {"sampling": {"seed": 7}},
        }
    )
    assert (
        line == "20.0 tok/s · prompt 10 tok @ 100.0 tok/s · first token 0.12 s · 20 tokens · seed 7"
    )
