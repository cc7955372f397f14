"""sv_scheduler: requests, a FIFO queue, page-budget admission, static and continuous batching.

Pure Python (stdlib + sv-kvcache). The engine calls `add`, then loops `schedule` /
`complete_step` (or its two halves, `advance` and `resolve`) while `has_unfinished()`; see
`Scheduler`.
"""

from .admission import check_request, clamp_max_new_tokens, credits_for
from .config import Policy, SchedulerConfig
from .errors import AdmissionError, SchedulerError
from .plan import PrefillChunk, StepPlan
from .request import FinishedRequest, FinishReason, Request, RequestId
from .scheduler import Scheduler
from .sequence import PENDING_TOKEN, Sequence, SequenceStatus
from .stats import SchedulerStats

__all__ = [
    "PENDING_TOKEN",
    "AdmissionError",
    "FinishReason",
    "FinishedRequest",
    "Policy",
    "PrefillChunk",
    "Request",
    "RequestId",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "SchedulerStats",
    "Sequence",
    "SequenceStatus",
    "StepPlan",
    "check_request",
    "clamp_max_new_tokens",
    "credits_for",
]
