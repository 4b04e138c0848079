"""ggstation desktop app (PySide6). Talks to engine/ only through app/engine_adapter.py
(behind the Protocols in app/engine_api.py) and app/workers.py."""

import os

from .qt_compat import protect_none_refcount

# The app launches numba's OpenMP parallel regions from more than one thread (the model loads on a
# worker QThread, then the scheduler thread decodes). With libgomp's default active wait, each
# launching thread keeps its own pool of spinning threads and they fight over the cores: decoding
# ran 5-15x slower than from the command line. Passive waiting makes idle pools sleep. It must be
# set before numba loads libgomp, hence here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

protect_none_refcount()
