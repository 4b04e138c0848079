"""Frozen entry point: the same `ggstation` command line (GUI by default, subcommands too)."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
