"""A JSON schema checked the way the grammar backend will compile it, without a tokenizer: the
HTTP process checks a request's tool schemas this way, so a bad one is a 400 naming its field
before the request is queued (the scheduler would only say that some grammar failed)."""

from __future__ import annotations

import json
from typing import Any

from radixlm.constrained.base_grammar_backend import _clean_message


def json_schema_error(schema: Any) -> str | None:
    """Why xgrammar cannot compile `schema` (a dict or a JSON string); None when it can, or when
    xgrammar is not installed (then no grammar is built from it either)."""
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        xgr.Grammar.from_json_schema(text, any_whitespace=False)
    except Exception as e:  # xgrammar raises RuntimeError (C++) or ValueError for a bad schema
        return _clean_message(e)
    return None
