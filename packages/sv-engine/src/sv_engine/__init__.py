"""sv_engine."""
