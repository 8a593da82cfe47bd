"""`mooncake._fast_copy.concat_arrays_into`: the reference's four cases
(`mooncake-wheel/tests/test_fast_copy.py`), plus what ours checks that the
reference leaves to luck: bad destinations, overlap, threads, dtypes."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mooncake._fast_copy import concat_arrays_into


def test_copies_selected_range():
    arrays = [
        np.arange(3, dtype=np.uint8),
        np.arange(4, dtype=np.uint8) + 10,
        np.arange(2, dtype=np.uint8) + 20,
    ]
    expected = np.concatenate(arrays[1:])
    destination = ctypes.create_string_buffer(expected.nbytes)
    copied = concat_arrays_into(arrays, ctypes.addressof(destination), len(destination), 1, 2)
    assert copied == expected.nbytes
    assert destination.raw[:copied] == expected.tobytes()


def test_rejects_small_destination():
    arrays = [np.arange(4, dtype=np.uint8), np.arange(4, dtype=np.uint8)]
    destination = ctypes.create_string_buffer(7)
    with pytest.raises(ValueError, match="destination buffer too small"):
        concat_arrays_into(arrays, ctypes.addressof(destination), len(destination))
    assert destination.raw == b"\0" * 7


def test_rejects_non_contiguous_source():
    arrays = [np.arange(8, dtype=np.uint8)[::2]]
    destination = ctypes.create_string_buffer(arrays[0].nbytes)
    with pytest.raises(ValueError, match="C-contiguous"):
        concat_arrays_into(arrays, ctypes.addressof(destination), len(destination))


def test_empty_range_returns_zero():
    arrays = [np.arange(4, dtype=np.uint8)]
    destination = ctypes.create_string_buffer(1)
    assert concat_arrays_into(arrays, ctypes.addressof(destination), 0, 0, 0) == 0


def test_start_and_count_are_clamped_like_the_reference():
    arrays = [np.full(2, i, dtype=np.uint8) for i in range(3)]
    destination = ctypes.create_string_buffer(6)
    ptr = ctypes.addressof(destination)
    assert concat_arrays_into(arrays, ptr, 6, -5) == 6
    assert concat_arrays_into(arrays, ptr, 6, 2, 100) == 2
    assert destination.raw[:2] == b"\2\2"
    assert concat_arrays_into(arrays, ptr, 6, 9) == 0


@pytest.mark.parametrize("threads", [1, 2, 3, 7, 64])
def test_threads_and_dtypes_give_the_same_bytes(threads):
    rng = np.random.default_rng(threads)
    arrays = [
        rng.standard_normal((5, 3)).astype(np.float32),
        np.empty(0, dtype=np.int64),
        rng.integers(0, 1 << 40, size=1000, dtype=np.int64),
        rng.standard_normal(333).astype(np.float16),
        np.frombuffer(b"xyz", dtype=np.uint8),
    ]
    want = b"".join(a.tobytes() for a in arrays)
    out = np.zeros(len(want) + 16, dtype=np.uint8)
    copied = concat_arrays_into(arrays, out.ctypes.data, out.nbytes, 0, -1, threads)
    assert copied == len(want)
    assert out[: len(want)].tobytes() == want
    assert not out[len(want):].any(), "nothing written past the arrays"


def test_bad_destinations_are_errors_not_crashes():
    arrays = [np.arange(64, dtype=np.uint8)]
    with pytest.raises(ValueError, match="writable"):
        concat_arrays_into(arrays, 0, 64)
    with pytest.raises(ValueError, match="writable"):
        concat_arrays_into(arrays, 8, 64)
    # A destination overlapping a source is refused before anything moves.
    src = np.arange(64, dtype=np.uint8)
    with pytest.raises(ValueError, match="overlaps"):
        concat_arrays_into([src], src.ctypes.data + 8, 64)
    assert (src == np.arange(64, dtype=np.uint8)).all()


def test_items_that_are_not_buffers_are_type_errors():
    destination = ctypes.create_string_buffer(8)
    with pytest.raises(TypeError, match=r"arrays\[1\]"):
        concat_arrays_into([np.zeros(1, np.uint8), object()], ctypes.addressof(destination), 8)
    with pytest.raises(TypeError):
        concat_arrays_into((np.zeros(1, np.uint8),), ctypes.addressof(destination), 8)
