"""sv_model."""
