#!/usr/bin/env bash
# Build the PyInstaller bundle into dist/ggstation and smoke-test it offscreen.
# The numba cache of a frozen app lives in ~/.cache/ggstation/numba (engine/jit.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "pyinstaller>=6.5" -e .
python -m PyInstaller --noconfirm --clean --distpath dist --workpath build/pyinstaller packaging/ggstation.spec
MODEL="${1:-smollm2}"
QT_QPA_PLATFORM=offscreen dist/ggstation/ggstation --self-test -m "$MODEL"
