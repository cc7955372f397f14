"""sv_weights."""
