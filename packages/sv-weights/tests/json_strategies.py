"""Hypothesis strategies shared by the config parsers' fuzz tests."""

from __future__ import annotations

from hypothesis import strategies as st

# Any JSON value, small: what a hand-edited or foreign config.json may hold where a field is.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
