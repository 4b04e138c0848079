"""PyInstaller entry point: the `ggstation` command line (the desktop app when given no command)."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
