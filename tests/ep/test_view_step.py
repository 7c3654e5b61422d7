"""ViewStep builds the view of a C-contiguous ndarray itself: it must be what numpy's reshape gives (same memory,
dtype, strides, flags and base), and any other input still goes through numpy's reshape."""

from __future__ import annotations

import numpy as np
import pytest

from npu_ep.kernels import runtime

ext = runtime.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the extension is not built")


_FLAGS = ("c_contiguous", "f_contiguous", "owndata", "writeable", "aligned", "writebackifcopy")


def _same_as_reshape(x, out_shape, copy=False):
    y = ext.ViewStep(x.shape, out_shape, 1).run((x,))[0]
    want = x.reshape(out_shape)
    assert type(y) is type(want) and y.dtype == want.dtype and y.shape == want.shape and y.strides == want.strides
    assert all(getattr(y.flags, f) == getattr(want.flags, f) for f in _FLAGS)
    if copy:
        assert not np.shares_memory(y, x) and not np.shares_memory(y, want)
    else:
        assert y.base is want.base and y.__array_interface__["data"] == want.__array_interface__["data"]
    np.testing.assert_array_equal(y, want)
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16, ">f4"])
@pytest.mark.parametrize(
    ("in_shape", "out_shape"),
    [((1, 64), (64,)), ((2, 3), (3, 2)), ((2, 3), (2, 3)), ((6,), (1, 6, 1)), ((1,), ()), ((), (1, 1)),
     ((0, 3), (3, 0))],
)
def test_a_view_of_a_c_contiguous_array_is_numpys_reshape(dtype, in_shape, out_shape):
    owner = np.arange(int(np.prod(in_shape)), dtype=np.float64).astype(dtype).reshape(in_shape).copy()
    _same_as_reshape(owner, out_shape)
    view = owner[...]  # a view: numpy collapses the base to the owner
    assert _same_as_reshape(view, out_shape).base is owner
    read_only = owner.copy()
    read_only.flags.writeable = False
    assert not _same_as_reshape(read_only, out_shape).flags.writeable
    buffer_view = np.frombuffer(bytearray(owner.tobytes()), dtype=owner.dtype).reshape(in_shape)  # base: no ndarray
    _same_as_reshape(buffer_view, out_shape)


def test_other_inputs_go_through_numpys_reshape():
    strided = np.arange(6, dtype=np.float32).reshape(3, 2).T  # not C-contiguous: a copy
    _same_as_reshape(strided, (6,), copy=True)
    sliced = np.arange(12, dtype=np.float32)[::2].reshape(2, 3)[:, :1]  # a view numpy can still make
    _same_as_reshape(sliced, (2,))
    sub = np.arange(6, dtype=np.float32).reshape(2, 3).view(np.matrix)
    assert type(ext.ViewStep((2, 3), (3, 2), 1).run((sub,))[0]) is np.matrix  # a subclass keeps its reshape
