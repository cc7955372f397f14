"""sv_cli."""
