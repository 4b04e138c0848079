"""Number formatting shared by widgets and item models."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def human_count(n: float) -> str:
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def rate(count: float, ms: float) -> str:
    return f"{count * 1000.0 / ms:.1f} tok/s" if ms > 0 and count > 0 else "–"


def reply_summary(stats: dict) -> str:
    """One line under a reply: speed, first token latency and counts."""
    if not stats:
        return ""
    n_p, n_g = stats.get("n_prompt", 0), stats.get("n_generated", 0)
    parts = [
        f"{rate(n_g, stats.get('t_gen_ms', 0))}",
        f"prompt {n_p} tok @ {rate(n_p - stats.get('n_cached', 0), stats.get('t_prompt_ms', 0))}",
    ]
    if stats.get("ttft_ms") is not None:
        parts.append(f"first token {stats['ttft_ms'] / 1000:.2f} s")
    parts.append(f"{n_g} tokens")
    seed = stats.get("replay", {}).get("sampling", {}).get("seed")
    if seed is not None:
        parts.append(f"seed {seed}")
    if stats.get("finish_reason") not in (None, "stop", "eos"):
        parts.append(str(stats["finish_reason"]))
    if stats.get("dropped_messages"):
        parts.append(f"{stats['dropped_messages']} old messages left out")
    return " · ".join(parts)


def replay_record(stats: dict) -> str:
    """The tooltip under a reply: everything needed to reproduce it."""
    r = stats.get("replay", {})
    if not r:
        return ""
    sampling = ", ".join(f"{k}={v}" for k, v in r.get("sampling", {}).items())
    if r.get("endpoint"):
        return f"model: {r.get('model')}\nserver: {r['endpoint']}\nn_ctx: {r.get('n_ctx') or 'not known'}\n{sampling}"
    return (
        f"model: {r.get('model')}\nsha256: {r.get('model_sha256')}\n"
        f"template: {r.get('template', '')} (sha256 {r.get('template_sha256')})\n"
        f"n_ctx: {r.get('n_ctx')}\n{sampling}"
    )
