"""``python -m monarch_ft {status,stacks,stop,verify} RUN_DIR``: the command line (:mod:`monarch_ft.cli.main`)."""

import sys

from monarch_ft.cli.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
