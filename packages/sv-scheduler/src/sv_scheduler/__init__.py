"""sv_scheduler."""
