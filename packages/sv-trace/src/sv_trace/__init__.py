"""sv_trace: see inside the engine.

- `sv_trace.recorder.StepRecorder`: `--trace FILE`, a JSON-lines record of every step
  (schema.json, versioned; it needs torch, the rest of the package does not);
- `render_report`: `sv trace report`, one self-contained HTML page of a trace;
- `pool_picture`: the page pool as the trace and the server's live dashboard draw it.
"""

from sv_trace.errors import TraceError
from sv_trace.pool import pool_picture
from sv_trace.report import render_report
from sv_trace.schema import SCHEMA_NAME, SCHEMA_VERSION, read_trace, trace_schema

__all__ = [
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "TraceError",
    "pool_picture",
    "read_trace",
    "render_report",
    "trace_schema",
]
