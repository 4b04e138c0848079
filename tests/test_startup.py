"""What `ggstation generate` loads on its way to the first token (issue "Speed on the CPUs
people own", start-up and memory): each check runs the real command in a fresh interpreter
and reads its sys.modules afterwards, so it cannot flake on a busy machine. The wall-clock and
peak-RSS figures are `perf` tests (deselected by default; tests/bench_latency.py prints them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGUFReader

from engine import jit
from engine.quants.generated import MODULES

ROOT = Path(__file__).resolve().parent.parent

# Packages a generate never uses, each with the command or feature that does. Loading one
# costs start-up time (jinja2 ~20 ms of CPU, asyncio ~25 ms, the HTTP stack and Qt far more).
NOT_FOR_GENERATE = {
    "fastapi": "serve",
    "starlette": "serve",
    "uvicorn": "serve",
    "pydantic": "serve",
    "httpx": "the Hub client",
    "huggingface_hub": "-hf and `models`",
    "llguidance": "grammars",
    "PySide6": "the GUI",
    "prompt_toolkit": "interactive chat",
    "jinja2": "chat templates",
    "asyncio": "the server's request streams",
    # numba's CPU target imports scipy.linalg only to pick np.convolve's inner loop;
    # engine.jit.init_target loads the target without it (0.13-0.25 s of CPU and ~20 MB)
    "scipy.linalg": "no engine kernel",
}

# Peak RSS from VmHWM, the high-water mark of this process's own memory map: Linux carries
# ru_maxrss across exec, so a child forked from a big pytest process (after the GUI tests,
# ~690 MB) reported the parent's size instead of its own.
_RUN_MAIN = """
import json, resource, sys
from engine.cli import main
rc = main(sys.argv[2:])
try:
    hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "modules": sorted(sys.modules), "maxrss_kb": hwm}, f)
"""


def run_cli(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> dict:
    """`ggstation ARGV` in a fresh interpreter: its exit status (rc), the modules it had
    loaded at the end, its peak RSS (maxrss_kb) and its stdout (text)."""
    report = tmp_path / "modules.json"
    out = subprocess.run(
        [sys.executable, "-c", _RUN_MAIN, str(report), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(report.read_text())
    return {**data, "modules": set(data["modules"]), "text": out.stdout}


def loaded_needlessly(modules: set[str]) -> dict[str, str]:
    return {
        name: why
        for name, why in NOT_FOR_GENERATE.items()
        if any(m == name or m.startswith(name + ".") for m in modules)
    }


def test_generate_loads_only_what_it_uses(tiny_llama_path, tmp_path):
    argv = (
        "generate",
        "-m",
        str(tiny_llama_path),
        "-p",
        "hello world",
        "-n",
        "4",
        "--temp",
        "0",
        "--no-mem-check",
    )
    first = run_cli(tmp_path, *argv)  # compiles whatever numba's cache lacks
    run = run_cli(tmp_path, *argv)
    assert run["rc"] == 0 and run["text"] == first["text"]
    assert loaded_needlessly(first["modules"]) == {} and loaded_needlessly(run["modules"]) == {}
    # a warm start loads the cached kernels without numba's typing and lowering registries
    # (engine.jit.LAZY_REGISTRIES; numba.np.arraymath is one of the modules they import)
    assert jit.LAZY_REGISTRIES and "numba.np.arraymath" not in run["modules"]
    # and imports the generated kernel modules of the model's tensor types only
    types = {t.tensor_type.name.lower() for t in GGUFReader(tiny_llama_path).tensors}
    kernels = {
        m.rsplit(".", 1)[1] for m in run["modules"] if m.startswith("engine.quants.generated.")
    }
    assert kernels and kernels <= types and len(types) < len(MODULES)


_COMPILE_AFTER_LOADS = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from engine import ops
x = np.ones((1, 8), np.float32)
ops.rmsnorm(x, np.ones(8, np.float32), 1e-5, x)  # cached kernels, loaded without the registries
import fresh_kernel  # a cache=True kernel numba has never seen: a cache miss, then a compile
print(fresh_kernel.f(np.arange(6.0)), sum(fresh_kernel.f.stats.cache_hits.values()),
      "numba.np.arraymath" in sys.modules, "scipy.linalg" in sys.modules)
"""


def test_a_kernel_compiled_after_cached_loads_gets_the_registries(tmp_path):
    """The lazy registries' other half: the first cache miss loads them (np.median needs
    arraymath's lowering), still without SciPy, and numba then caches what it compiled."""
    (tmp_path / "fresh_kernel.py").write_text(
        "import numpy as np\nfrom engine import jit\n\n@jit.kernel\n"
        "def f(x):\n    return np.sort(-x).sum() + np.median(x)\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", _COMPILE_AFTER_LOADS, str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        for _ in range(2)
    ]
    for out in runs:
        assert out.returncode == 0, out.stderr
    assert runs[0].stdout.split() == ["-12.5", "0", "True", "False"]
    assert runs[1].stdout.split()[:2] == ["-12.5", "1"]  # from numba's cache this time


def test_help_and_parser_load_no_server_or_gui(tmp_path):
    report = tmp_path / "modules.json"
    code = (
        "import json, sys; from engine.cli import build_parser; build_parser()\n"
        f"json.dump(sorted(sys.modules), open({str(report)!r}, 'w'))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)
    assert loaded_needlessly(set(json.loads(report.read_text()))) == {}


_SCIPY_AFTER_INIT = """
import sys
from gguf import GGUFReader

from engine import jit
from engine.quants.generated import MODULES
jit.init_target()
assert "scipy.linalg" not in sys.modules and "scipy.linalg.cython_blas" not in sys.modules
from numba.np import arraymath
assert not arraymath._HAVE_BLAS  # the probe saw no SciPy BLAS
try:
    import scipy.linalg.cython_blas  # noqa: F401  refused only while the target loaded
except ImportError:
    print("no scipy")
else:
    print("scipy ok")
"""


def test_init_target_refuses_scipy_only_while_numba_loads():
    out = subprocess.run(
        [sys.executable, "-c", _SCIPY_AFTER_INIT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    try:
        import scipy  # noqa: F401
    except ImportError:
        assert out.stdout.strip() == "no scipy"
    else:
        assert out.stdout.strip() == "scipy ok"


# Seconds for a whole `ggstation generate -n 16` with SmolLM2 (warm numba cache, pyc files
# written), and its peak RSS. The goals: start to first token <= 1.0 s and peak RSS
# <= llama.cpp's + 100 MB (llama-cpp-python: 0.84 s and 253 MB for the same job on the
# filer's machine). Measured on the 2-core development machine with load average 10-12 from
# other runs: 6-8 s in all (decode alone 3-4 s of it; 0.9 s of CPU to the first token) and
# 273 MB; loose bounds.
GENERATE_16_LIMIT_S = 15.0
GENERATE_PEAK_RSS_LIMIT_MB = 353


@pytest.mark.model
@pytest.mark.perf
def test_generate_smollm2_wall_time_and_peak_rss(smollm2_path, tmp_path, perf_figure):
    argv = ["generate", "-m", str(smollm2_path), "-p", "Hello", "-n", "16", "--seed", "1"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as installed
    run_cli(tmp_path, *argv, env=env)  # warm numba's cache and the pyc files
    t0 = time.perf_counter()
    run = run_cli(tmp_path, *argv, env=env)
    wall = time.perf_counter() - t0
    assert run["rc"] == 0 and run["text"]
    perf_figure("generate SmolLM2 -n 16: whole run", wall, "s", at_most=GENERATE_16_LIMIT_S)
    perf_figure(
        "generate SmolLM2 -n 16: peak RSS",
        run["maxrss_kb"] / 1024,
        "MB",
        at_most=GENERATE_PEAK_RSS_LIMIT_MB,
    )


_EXIT_HOOK = """
import atexit, gc, sys
from engine.commands import common

def collections():
    return sum(s["collections"] for s in gc.get_stats())

at_resume = []
resume = common.resume_collector
def watched_resume():
    at_resume.append(collections())
    resume()
common.resume_collector = watched_resume
import engine.commands.generate as generate
generate.resume_collector = watched_resume

def report():  # registered first: runs last; on its own line after generated text
    print()
    print("frozen" if gc.get_freeze_count() else "collecting", "enabled" if gc.isenabled() else "disabled",
          "collections while loading:", at_resume[0] - before if at_resume else None)
atexit.register(report)
from engine.cli import main
before = collections()
if sys.argv[1] == "own":
    sys.argv = ["ggstation", *sys.argv[2:]]
    sys.exit(main())
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    "how, command, expected",
    [
        ("own", "tokenize", "frozen enabled"),
        ("given", "tokenize", "collecting enabled"),
        ("own", "generate", "frozen enabled collections while loading: 0"),
    ],
)
def test_own_command_line_skips_needless_collections(tiny_llama_path, how, command, expected):
    """The process's own command line skips the shutdown's garbage collections (0.2-0.3 s of
    CPU after a generate), and `generate`/`chat` collect nothing while numba and the model load
    (~0.1 s), then collect again; main(argv) called by a program leaves its collector alone."""
    argv = ["-m", str(tiny_llama_path), "-p", "hello"]
    if command == "generate":
        argv += ["-n", "2", "--no-mem-check"]
    out = subprocess.run(
        [sys.executable, "-c", _EXIT_HOOK, how, command, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith(expected)
