"""`python -m magpie.mcp`: the same as `magpie mcp`."""

import sys

from magpie.cli import main

sys.exit(main(["mcp", *sys.argv[1:]]))
