"""`sv trace report FILE -o report.html`: draw a step trace (`--trace FILE`) as one page."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    trace = sub.add_parser("trace", help="step traces: `sv trace report FILE -o report.html`")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    trace_sub.required = True
    p = trace_sub.add_parser(
        "report",
        help="draw a trace as one self-contained HTML page",
        description="Draw a step trace (written by --trace FILE) as one self-contained HTML page: "
        "the --stats figures, a timeline of requests, the page pool at every step, the batch of "
        "every step, and each request's tokens with their alternatives on hover. The page needs "
        "no network to be viewed.",
    )
    p.add_argument("trace_file", metavar="FILE", help="a trace written by --trace")
    p.add_argument("-o", "--output", metavar="HTML", required=True, help="the page to write")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sv_trace import TraceError
    from sv_trace.report import write_report

    def note(message: str) -> None:
        print(f"sv trace report: note: {message}", file=sys.stderr)

    for name, value in (("FILE", args.trace_file), ("-o/--output", args.output)):
        if not value.strip():  # (an unset shell variable: not this folder, as Path("") is)
            print(f"sv trace report: error: {name} must not be empty", file=sys.stderr)
            return 2
    try:
        write_report(args.trace_file, args.output, note)
    except TraceError as e:
        print(f"sv trace report: error: {e}", file=sys.stderr)
        return 2
    print(f"sv trace report: wrote {args.output}", file=sys.stderr)
    return 0
