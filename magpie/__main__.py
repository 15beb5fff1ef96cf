import sys

from magpie.cli import main

sys.exit(main())
