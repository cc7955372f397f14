"""`sv generate --logprobs K`: each output token beside the alternatives the model weighed.

One line per token: its position, its text (quoted, so spaces and newlines show), its
probability and log-probability, then the top K alternatives with their probabilities:

      1  ' Paris'     p=0.8123  logp=-0.2079  | ' Paris' 0.8123  ' the' 0.0611  ' a' 0.0202
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `sv --help` imports no torch
    from sv_engine import TokenLogprob
    from sv_tokenizer import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text, quoted and escaped (a cut multi-byte character shows as U+FFFD)."""
    return repr(tokenizer.shown_bytes(token_id).decode("utf-8", errors="replace"))


def lines(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> list[str]:
    out = []
    width = max((len(token_text(tokenizer, lp.token_id)) for lp in logprobs), default=0)
    for i, lp in enumerate(logprobs, start=1):
        text = token_text(tokenizer, lp.token_id).ljust(width)
        line = f"{i:6d}  {text}  p={math.exp(lp.logprob):.4f}  logp={lp.logprob:.4f}"
        if lp.top:
            alternatives = "  ".join(
                f"{token_text(tokenizer, t)} {math.exp(v):.4f}" for t, v in lp.top
            )
            line += f"  | {alternatives}"
        out.append(line)
    return out
