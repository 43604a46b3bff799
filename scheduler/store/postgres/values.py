"""Values PostgreSQL can hold: `jsonb` refuses `\\u0000`, lone surrogates, NaN and Infinity,
`text` refuses NUL; one such value in a statement fails the whole statement."""

from __future__ import annotations

import base64
import json

import asyncpg

# Errors that belong to a row's values (data exceptions, constraint violations, program
# limits such as an index row too large), as opposed to the connection or the server: a
# statement failing with one of them is split to find the row (see TaskStore.insert_batch).
ROW_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
    UnicodeEncodeError,
)


def jsonb_text(raw: bytes) -> str:
    """`raw` as JSON text `jsonb` accepts: the document itself when it is JSON that `jsonb` can
    hold, else `{"_raw_base64": ...}` (the bytes, base64-encoded)."""
    try:
        doc = json.loads(raw)
        text = json.dumps(doc, ensure_ascii=False, allow_nan=False)  # ValueError: NaN, inf
        text.encode()  # UnicodeEncodeError (a ValueError): lone surrogates
    except (ValueError, RecursionError):
        return raw_json(raw)
    if "\\u0000" in text:
        return raw_json(raw)
    return text


def raw_json(raw: bytes) -> str:
    return json.dumps({"_raw_base64": base64.b64encode(raw).decode()})
