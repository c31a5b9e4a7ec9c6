"""jsoncost: the values a JSON text holds, counted without parsing it, window by window."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from model_runtime.server.tensors import jsoncost

pytestmark = pytest.mark.timeout(60)

# Strings whose quotes, backslashes and brackets must not count as values.
_TRICKY = st.sampled_from(['a\\"', "\\\\", ",[{:", '"', "x\\", "", "\\\\\\"])
_JSON = st.recursive(
    st.one_of(_TRICKY, st.integers(), st.booleans(), st.none()),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY, inner, max_size=4),
    max_leaves=30,
)


def _values(doc: Any) -> int:
    """What the count should be: one per string (keys too), list, object and separator."""
    if isinstance(doc, dict):  # '{', then per key: its string and ':', and the commas
        return 1 + 2 * len(doc) + max(len(doc) - 1, 0) + sum(_values(v) for v in doc.values())
    if isinstance(doc, list):
        return 1 + max(len(doc) - 1, 0) + sum(_values(v) for v in doc)
    return 1 if isinstance(doc, str) else 0


@settings(max_examples=150, deadline=None)
@given(_JSON, st.integers(1, 9))
def test_the_count_is_exact_across_window_edges(doc: Any, window: int) -> None:
    text = json.dumps(doc).encode()
    saved = jsoncost.WINDOW
    jsoncost.WINDOW = window  # windows of a few bytes: runs and strings cross their edges
    try:
        got = jsoncost._count(np.frombuffer(text, np.uint8), 1 << 30)
    finally:
        jsoncost.WINDOW = saved
    assert got == _values(doc)
    assert jsoncost.values_at_most(text, 0, len(text), got)
    assert not jsoncost.values_at_most(text, 0, len(text), got - 1) or got == 0
