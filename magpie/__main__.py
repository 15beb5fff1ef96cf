import sys

from magpie.cli import main

if __name__ == "__main__":  # process-pool workers re-import this module; they must not run the CLI
    sys.exit(main())
