"""The one exception type of sv-engine."""

from __future__ import annotations


class EngineError(Exception):
    """Bad engine input or configuration: the message names what was wrong and what was expected.

    An error made by `bad_field` opens with the parameter it is about (`temperature must be
    >= 0, got -1.0`) and keeps it in `field`: a caller whose users know the parameter by
    another name (a command-line flag) renames it with `named`, so one check serves both."""

    field: str | None = None
    problem: str = ""

    @classmethod
    def bad_field(cls, field: str, problem: str) -> EngineError:
        """`field` was wrong: `problem` says how (`must be >= 0, got -1.0`)."""
        error = cls(f"{field} {problem}")
        error.field, error.problem = field, problem
        return error

    def named(self, name: str) -> EngineError:
        """This error with its field called `name` (a ValueError if it is about no field)."""
        if self.field is None:
            raise ValueError(f"this error is about no field: {self}")
        return EngineError.bad_field(name, self.problem)
