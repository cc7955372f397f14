"""sv_kernels."""
