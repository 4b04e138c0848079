"""`python -m engine ...` runs the same command line as the `ggstation` script."""

import sys

from .cli import main

sys.exit(main())
