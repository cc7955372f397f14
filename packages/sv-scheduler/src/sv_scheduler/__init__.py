"""sv_scheduler: requests, a FIFO queue, page-budget admission (conservative or preemptive),
static and continuous batching.

Pure Python (stdlib + sv-kvcache). The engine calls `add`, then loops `schedule` /
`complete_step` (or its two halves, `advance` and `resolve`) while `has_unfinished()`; see
`Scheduler`.
"""

from .admission import (
    AdmissionPolicy,
    ConservativeAdmission,
    PreemptiveAdmission,
    check_request,
    clamp_max_new_tokens,
    credits_for,
    max_new_tokens_that_fit,
    window_credits_for,
)
from .config import Admission, Policy, SchedulerConfig, check_batch_limits
from .errors import AdmissionError, SchedulerError
from .plan import COUNTED_WAITS, PrefillChunk, StepPlan, WaitReason
from .request import FinishedRequest, FinishReason, Request, RequestId
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus
from .speculation import SpeculationConfig
from .stats import SchedulerStats

__all__ = [
    "COUNTED_WAITS",
    "Admission",
    "AdmissionError",
    "AdmissionPolicy",
    "ConservativeAdmission",
    "FinishReason",
    "FinishedRequest",
    "Policy",
    "PreemptiveAdmission",
    "PrefillChunk",
    "Request",
    "RequestId",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "SchedulerStats",
    "Sequence",
    "SequenceStatus",
    "SpeculationConfig",
    "StepPlan",
    "WaitReason",
    "check_batch_limits",
    "check_request",
    "clamp_max_new_tokens",
    "credits_for",
    "max_new_tokens_that_fit",
    "window_credits_for",
]
