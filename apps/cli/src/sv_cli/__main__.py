"""`python -m sv_cli ...` runs the `sv` command (used where no console script is installed)."""

import sys

from sv_cli.main import main

sys.exit(main())
