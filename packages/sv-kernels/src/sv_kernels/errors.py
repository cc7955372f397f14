"""The one exception type of sv_kernels."""

from __future__ import annotations


class KernelError(ValueError):
    """An op was called with inputs it cannot handle (wrong shape, dtype, device, ...).

    The message names the op, the argument and what was expected.
    """
