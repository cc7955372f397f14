"""The on-disk kernel tuning cache: kept entries come back, anything wrong is a warning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sv_kernels import tuning_cache
from sv_kernels.tuning_cache import TunedShape

H200 = "NVIDIA H200 (sm 9.0), torch 2.11.0, triton 3.6.0, configs 0123abcd"
OTHER = "NVIDIA A100 (sm 8.0), torch 2.11.0, triton 3.6.0, configs 0123abcd"
QKV = TunedShape((2, 512, 2), 4.5, 6.9)
O_PROJ = TunedShape(None, 6.5, 6.5)


def test_entries_come_back_per_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tuning.json"  # the folder is made on the first store
    tuning_cache.store(path, H200, {"3072x2048 torch.bfloat16": QKV})
    tuning_cache.store(path, OTHER, {"3072x2048 torch.bfloat16": O_PROJ})
    tuning_cache.store(path, H200, {"2048x2048 torch.bfloat16": O_PROJ})  # merged, not replaced
    assert tuning_cache.load(path, H200) == {
        "3072x2048 torch.bfloat16": QKV,
        "2048x2048 torch.bfloat16": O_PROJ,
    }
    assert tuning_cache.load(path, OTHER) == {"3072x2048 torch.bfloat16": O_PROJ}
    assert tuning_cache.load(path, "some other GPU") == {}
    assert [p.name for p in path.parent.iterdir()] == ["tuning.json"]  # no temporary left
    # the file is what the module doc shows
    document = json.loads(path.read_text())
    assert document["format"] == 1
    assert document["fingerprints"][H200]["3072x2048 torch.bfloat16"] == {
        "choice": [2, 512, 2],
        "us": 4.5,
        "cublas_us": 6.9,
    }


def test_a_missing_file_is_empty_without_a_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning_cache.load(tmp_path / "none.json", H200) == {}


def _with_entry(entry: object) -> str:
    return json.dumps({"format": 1, "fingerprints": {H200: {"s": entry}}})


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "not a tuning cache"),
        ("[]", "format"),
        ('{"format": 2, "fingerprints": {}}', "format"),
        ('{"format": 1, "fingerprints": []}', "fingerprints"),
        (json.dumps({"format": 1, "fingerprints": {H200: []}}), "not an object"),
        (_with_entry(3), "not an object"),
        (_with_entry({"choice": "x", "us": 1, "cublas_us": 1}), "choice"),
        (_with_entry({"choice": [0], "us": 1, "cublas_us": 1}), "choice"),
        (_with_entry({"choice": [True], "us": 1, "cublas_us": 1}), "choice"),
        (_with_entry({"choice": None, "us": -1, "cublas_us": 1}), "us"),
        (_with_entry({"choice": None, "us": float("nan"), "cublas_us": 1}), "us"),
        (_with_entry({"choice": None, "us": 1}), "cublas_us"),
    ],
)
def test_a_damaged_file_is_a_warning_and_then_replaced(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "tuning.json"
    path.write_text(text)
    with pytest.warns(RuntimeWarning, match=rf"tuning\.json: kernel tuning cache: .*{why}"):
        assert tuning_cache.load(path, H200) == {}
    tuning_cache.store(path, H200, {"3072x2048 torch.bfloat16": QKV})  # measured again: kept
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning_cache.load(path, H200) == {"3072x2048 torch.bfloat16": QKV}


def test_an_unwritable_place_is_a_warning(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(RuntimeWarning, match="cannot write it"):
        tuning_cache.store(blocker / "tuning.json", H200, {"s": QKV})  # parent is a file
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_an_unreadable_file_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "tuning.json"
    path.mkdir()  # reading a folder fails with an OSError
    with pytest.warns(RuntimeWarning, match="cannot read it"):
        assert tuning_cache.load(path, H200) == {}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    document=st.fixed_dictionaries(
        {
            "format": st.just(1) | JSON,
            "fingerprints": st.dictionaries(st.just(H200) | st.text(max_size=4), JSON, max_size=2),
        }
    )
    | JSON
)
def test_any_json_loads_or_warns(tmp_path: Path, document: object) -> None:
    """Fuzz: whatever JSON the file holds, `load` returns well-formed entries or warns."""
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(document))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entries = tuning_cache.load(path, H200)
    for shape, tuned in entries.items():
        assert isinstance(shape, str) and isinstance(tuned, TunedShape)
        assert tuned.choice is None or all(isinstance(v, int) and v > 0 for v in tuned.choice)
        assert tuned.us >= 0 and tuned.cublas_us >= 0
