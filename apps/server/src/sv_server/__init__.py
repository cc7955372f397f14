"""sv-server: an OpenAI-compatible HTTP server for the sv engine.

One thread owns the Engine and runs its step loop (`EngineLoop`); a Starlette app
(`create_app`) serves /v1/completions, /v1/chat/completions (both streamed as server-sent
events or not), /v1/models, /health and /metrics. `sv serve` (`serve_main`) runs it on uvicorn.
"""

from sv_server.app import create_app
from sv_server.cli import serve_main
from sv_server.engine_loop import EngineLoop
from sv_server.errors import ServerError
from sv_server.stops import StopStringMatcher

__all__ = ["EngineLoop", "ServerError", "StopStringMatcher", "create_app", "serve_main"]
