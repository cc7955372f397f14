"""The exceptions of sv-scheduler: one family, `SchedulerError`."""


class SchedulerError(Exception):
    """A scheduler used out of order or configured badly (e.g. `schedule()` twice in a row)."""


class AdmissionError(SchedulerError):
    """A request that can never run: the message names the request and the numbers."""
