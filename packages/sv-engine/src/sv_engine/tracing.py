"""`--trace FILE`: attach a step recorder (sv_trace) to an engine, and detach it.

Tracing is off unless started here: the engine's hooks are then one `is None` test each.
"""

from __future__ import annotations

from pathlib import Path

from sv_trace import TraceError
from sv_trace.recorder import StepRecorder

from sv_engine.engine import Engine
from sv_engine.errors import EngineError


def start_trace(engine: Engine, path: str | Path, *, model: str) -> StepRecorder:
    """Record every step of `engine` into `path` (JSON lines, replaced if it exists)."""
    if engine.tracer is not None:
        raise EngineError("this engine already records a trace")
    runner = engine.runner
    try:
        recorder = StepRecorder.open(
            path,
            engine.scheduler,
            engine.tokenizer,
            cuda=runner.is_cuda,
            header={"model": model, "device": str(runner.device)},
        )
    except TraceError as e:
        raise EngineError(str(e)) from None
    engine.tracer = recorder
    runner.logits_observer = recorder.on_logits
    return recorder


def stop_trace(engine: Engine) -> None:
    """Write the trace's end line (the --stats figures) and close it; nothing if none is open."""
    recorder = engine.tracer
    if recorder is None:
        return
    engine.tracer = None
    engine.runner.logits_observer = None
    recorder.close(engine.stats)
