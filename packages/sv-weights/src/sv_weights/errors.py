"""The one exception type of sv-weights."""


class WeightsError(Exception):
    """Any bad input met while reading, validating, writing or converting weights.

    The message names the file, the tensor or key, and what was expected, so a user can fix
    the checkpoint without reading a traceback.
    """
