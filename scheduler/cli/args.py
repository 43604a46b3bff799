"""Argument types the operator verbs share."""

from __future__ import annotations

import argparse
from datetime import datetime


def instant(text: str, unparsable: str = "is not an RFC 3339 time") -> str:
    """An RFC 3339 time with an offset (`Z` or `z` for UTC), as ISO text for the API;
    ArgumentTypeError saying what is wrong (`unparsable` after the text when it is no time)."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {unparsable}") from exc
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs an offset or Z (2026-11-22T06:00Z)")
    return value.isoformat()
