"""What rank 0 sends the other ranks, and how they run it: one protocol, both ends.

Under tensor parallelism every rank runs the same `ModelRunner` calls in the same order: each
forward's all-reduces pair up across ranks only that way. Rank 0 (the engine's process: the
tokenizer, the scheduler and the step loop) runs a `LeaderRunner`, which broadcasts each call
that touches the model (block-table rows, a step's `StepInputs`, a warm-up) on the control
group and then makes it itself; the others run `serve_steps`, which receives each call and
makes it on their own runner. Every rank samples: the logits are the same on every rank (the
LM head is replicated and the all-reduce gives every rank the same sum), and so are the
sampling parameters and seeds in the step inputs, so every rank draws the same ids and keeps
them in its own `last_ids` for the next step's `feed`, with no second broadcast.

A step's grammar mask is made on rank 0 (the matchers live there) once the forward is queued;
it follows the step on the control group at that point of `launch`, on every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch.distributed as dist
from sv_model import ModelRunner, PendingTokens, StepInputs, TokenBitmask
from sv_model.parallel import TensorParallel
from torch import Tensor

from sv_engine.errors import EngineError

STOP = "stop"
# How long a failed call waits to hear which rank process ended.
FAILURE_WAIT_S = 2.0


@dataclasses.dataclass(frozen=True)
class RankPool:
    """One rank's KV pool, as it reports it: pages (the scratch page apart) and its heads."""

    rank: int
    num_pages: int
    kv_heads: int
    head_dim: int


class LeaderRunner(ModelRunner):
    """Rank 0's runner: every call that runs the model goes to the other ranks first.

    `rank_failure` says why the ranks can no longer go on (a rank process that has ended, as
    the watchdog of sv_engine.ranks saw it), or None; a call then raises an EngineError saying
    so instead of waiting on a collective no one will join."""

    def __init__(
        self,
        *args: Any,
        rank_failure: Callable[[], str | None],
        on_close: Callable[[], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        tp = self.model.tensor_parallel
        if tp is None:
            raise EngineError("a LeaderRunner needs a tensor_parallel group")
        self.tensor_parallel: TensorParallel = tp
        self._rank_failure = rank_failure
        self._on_close = on_close
        self._depth = 0  # calls in progress: only the outermost is sent (warmup calls launch)
        self.in_call = False  # inside a call that the other ranks must join (the watchdog's)
        self.closed = False
        # A call left midway by Ctrl-C: the other ranks may wait inside it for rank 0 for good.
        self.interrupted = False
        self.rank_pids: list[int] = []  # the processes of ranks 1..N-1 when this one started them

    def set_block_tables(self, rows: Sequence[tuple[int, Sequence[int]]]) -> None:
        rows = [(row, list(pages)) for row, pages in rows]  # a BlockTable is the scheduler's
        with self._on_every_rank("set_block_tables", rows):
            super().set_block_tables(rows)

    def launch(self, step: StepInputs) -> PendingTokens:
        mask = step.token_bitmask
        sent = dataclasses.replace(step, token_bitmask=None)
        with self._on_every_rank("launch", sent, mask is not None):
            if mask is not None:
                step = dataclasses.replace(step, token_bitmask=_sending_mask(self, mask))
            return super().launch(step)

    def logits(self, step: StepInputs, *, every_token: bool = False) -> Tensor:
        with self._on_every_rank("logits", step, every_token):
            return super().logits(step, every_token=every_token)

    def warmup(
        self, max_prefill_tokens: int = 2048, progress: Callable[[str], None] | None = None
    ) -> None:
        with self._on_every_rank("warmup", max_prefill_tokens):
            super().warmup(max_prefill_tokens, progress)

    def tune_linear(self, progress: Callable[[str], None] | None = None) -> None:
        with self._on_every_rank("tune_linear"):
            super().tune_linear(progress)

    def rank_pools(self) -> list[RankPool]:
        """Every rank's KV pool, rank 0 first."""
        with self._on_every_rank("rank_pools"):
            pools = self.tensor_parallel.gather(_pool(self))
        return [pool for pool in pools if isinstance(pool, RankPool)]

    def close(self) -> None:
        """Tell the other ranks to stop, end their processes, leave the groups (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.interrupted:  # they would not hear a stop: end them
            for pid in self.rank_pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        elif self._rank_failure() is None:
            with contextlib.suppress(RuntimeError):  # a rank already gone: on_close ends the rest
                self.tensor_parallel.broadcast((STOP,))
        self._on_close()
        self.tensor_parallel.leave()

    @contextlib.contextmanager
    def _on_every_rank(self, *command: object) -> Iterator[None]:
        outermost = self._depth == 0
        if outermost:
            self._check()
        self._depth += 1
        self.in_call = True
        try:
            if outermost:
                self.tensor_parallel.broadcast(command)
            yield
        except RuntimeError as e:  # gloo's errors are RuntimeErrors; NCCL's DistErrors
            failure = self._failure_after(e)
            if failure is None:
                raise
            raise EngineError(f"tensor parallelism: {failure} ({_first_line(e)})") from e
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        finally:
            self._depth -= 1
            self.in_call = self._depth > 0

    def _failure_after(self, error: RuntimeError) -> str | None:
        """Why the ranks cannot go on, once a call failed with `error`: a rank process that
        ended (its watchdog may hear of it a moment after the socket closed), or a failed
        collective; None for an error of the call itself."""
        deadline = time.monotonic() + FAILURE_WAIT_S
        while self._rank_failure() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        failure = self._rank_failure()
        if failure is None and isinstance(error, dist.DistError):
            failure = "a collective between the ranks failed"
        return failure

    def _check(self) -> None:
        if self.closed:
            raise EngineError("tensor parallelism: the ranks were stopped (the runner is closed)")
        if self.interrupted:
            raise EngineError(
                "tensor parallelism: a call was interrupted; the ranks are out of step"
            )
        failure = self._rank_failure()
        if failure is not None:
            raise EngineError(f"tensor parallelism: {failure}")


def _sending_mask(
    leader: LeaderRunner, mask: Callable[[], TokenBitmask | None]
) -> Callable[[], TokenBitmask | None]:
    def send() -> TokenBitmask | None:
        made: TokenBitmask | None = None
        try:
            made = mask()
        finally:  # the others wait for it even when making it failed (they then sample unmasked)
            leader.tensor_parallel.broadcast(made)
        return made

    return send


def _pool(runner: ModelRunner) -> RankPool:
    tp = runner.model.tensor_parallel
    return RankPool(
        0 if tp is None else tp.rank,
        runner.num_pages,
        runner.config.num_key_value_heads,
        runner.config.head_dim,
    )


def serve_steps(runner: ModelRunner, tp: TensorParallel) -> None:
    """A rank other than 0: make each call rank 0 sends, on `runner`, until it says stop.

    A call refusing its inputs (ValueError, EngineError) refused them on rank 0 too (the same
    inputs, the same checks), so the rank goes on with the next one; any other error (a
    collective failing: rank 0 or another rank gone) ends the loop."""
    while True:
        command = tp.broadcast()
        if not isinstance(command, tuple) or not command or command[0] == STOP:
            return
        name, *args = command
        serve = _SERVED.get(name)
        if serve is None:
            raise EngineError(f"tensor parallelism: rank {tp.rank} got an unknown call {name!r}")
        try:
            serve(runner, tp, *args)
        except (ValueError, EngineError):  # bad step inputs: rank 0 raised the same, and says so
            continue


def _launch(runner: ModelRunner, tp: TensorParallel, step: StepInputs, masked: bool) -> None:
    if masked:
        step = dataclasses.replace(step, token_bitmask=lambda: _received_mask(tp))
    runner.launch(step)  # its ids stay in last_ids, for the next step's feed


def _received_mask(tp: TensorParallel) -> TokenBitmask | None:
    mask = tp.broadcast()
    return mask if isinstance(mask, TokenBitmask) else None


_SERVED: dict[object, Callable[..., object]] = {
    "set_block_tables": lambda runner, tp, rows: runner.set_block_tables(rows),
    "launch": _launch,
    "logits": lambda runner, tp, step, every_token: runner.logits(step, every_token=every_token),
    "warmup": lambda runner, tp, max_prefill_tokens: runner.warmup(max_prefill_tokens),
    "tune_linear": lambda runner, tp: runner.tune_linear(),
    "rank_pools": lambda runner, tp: tp.gather(_pool(runner)),
}


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
