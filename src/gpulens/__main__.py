"""`python -m gpulens`: the same CLI as the `gpulens` command."""

import sys

from gpulens.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
