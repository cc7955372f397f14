"""`python -m sv_server [options]`: the same as `sv serve [options]`."""

from sv_server.cli import main

main()
