"""'Did you mean' hints for mistyped keys and names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest choice, or '' when none is close."""
    choices = list(choices)
    if len(word) > 2 * max((len(c) for c in choices), default=0) + 8:
        return ""  # too long to be a typo of any (and difflib's cost grows with it)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
