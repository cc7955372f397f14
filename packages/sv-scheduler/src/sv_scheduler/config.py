"""Scheduler settings, checked once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import SchedulerError
from .speculation import SpeculationConfig

Policy = Literal["continuous", "static"]
Admission = Literal["conservative", "preemptive"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """How the scheduler shares the KV-cache pool and each step's token budget.

    num_pages:       pages in the KV-cache pool (see sv_kvcache.pages_for_mib).
    max_model_len:   context limit: prompt plus output tokens of one request.
    page_size:       tokens per page.
    policy:          "continuous" admits whenever credits and table rows allow; "static" admits a new
                     group only when the previous group has completely finished.
    max_num_seqs:    running sequences at most; also the number of table rows.
    max_step_tokens: tokens fed to the model in one step (decodes + prefill chunks). At least
                     max_num_seqs, so every running decode fits in every step.
    prefix_caching:  share full prompt pages between requests with the same prefix.
    admission:       "conservative" reserves each request's whole budget at admission (never
                     preempts); "preemptive" admits on the prompt's pages and preempts the newest
                     running request (it recomputes later) when pages run out. See admission.py.
    sliding_window:  the model's attention window (Mistral), or None: a running sequence gives
                     back each page once the window has passed it (`BlockTable.release_pages_before`).
                     Conservative credits are then what a request holds at once: the window's
                     pages and one chunk's (`admission.window_credits_for`).
    speculation:     prompt-lookup speculative decoding (speculation.py); None: off.
    """

    num_pages: int
    max_model_len: int
    page_size: int = 16
    policy: Policy = "continuous"
    max_num_seqs: int = 256
    max_step_tokens: int = 8192
    prefix_caching: bool = True
    admission: Admission = "conservative"
    sliding_window: int | None = None
    speculation: SpeculationConfig | None = None

    def __post_init__(self) -> None:
        check_batch_limits(self.max_num_seqs, self.max_step_tokens, "SchedulerConfig.")
        for name in ("num_pages", "max_model_len", "page_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SchedulerError(
                    f"SchedulerConfig.{name} must be a positive integer, got {value!r}"
                )
        if self.max_model_len < 2:
            raise SchedulerError(
                f"SchedulerConfig.max_model_len must be at least 2 (one prompt token and one "
                f"output token), got {self.max_model_len}"
            )
        if self.sliding_window is not None and (
            isinstance(self.sliding_window, bool)
            or not isinstance(self.sliding_window, int)
            or self.sliding_window < 1
        ):
            raise SchedulerError(
                f"SchedulerConfig.sliding_window must be a positive integer or None, "
                f"got {self.sliding_window!r}"
            )
        if self.policy not in ("continuous", "static"):
            raise SchedulerError(
                f"SchedulerConfig.policy must be 'continuous' or 'static', got {self.policy!r}"
            )
        if self.admission not in ("conservative", "preemptive"):
            raise SchedulerError(
                f"SchedulerConfig.admission must be 'conservative' or 'preemptive', "
                f"got {self.admission!r}"
            )
        if not isinstance(self.prefix_caching, bool):
            raise SchedulerError("SchedulerConfig.prefix_caching must be a bool")
        if self.speculation is not None and not isinstance(self.speculation, SpeculationConfig):
            raise SchedulerError("SchedulerConfig.speculation must be a SpeculationConfig or None")


def check_batch_limits(max_num_seqs: int, max_step_tokens: int, owner: str = "") -> None:
    """SchedulerError unless both are positive integers and a step can hold one decode token of
    every running sequence. `owner` prefixes the names in the message ("SchedulerConfig.");
    the engine checks its arguments with this before it loads any weights."""
    for name, value in (("max_num_seqs", max_num_seqs), ("max_step_tokens", max_step_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SchedulerError(f"{owner}{name} must be a positive integer, got {value!r}")
    if max_step_tokens < max_num_seqs:
        raise SchedulerError(
            f"{owner}max_step_tokens ({max_step_tokens}) must be at least max_num_seqs "
            f"({max_num_seqs}): every running decode needs one token per step"
        )
