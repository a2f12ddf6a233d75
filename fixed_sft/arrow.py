"""Arrow arrays made from numpy buffers and Python strings, without ``pa.array``.

``pa.array`` imports pandas on its first call wherever pandas is installed (about 0.3 s, in
each process of a build); the arrays a build makes are plain buffers, so they are made
from them. Values are never null unless a ``valid`` mask or a ``None`` says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def numbers(values: npt.ArrayLike, type: pa.DataType, valid: npt.ArrayLike | None = None) -> pa.Array:
    """``values`` (1-d) as an Arrow array of the integer or boolean ``type``, cast as numpy
    casts them; null where ``valid`` is False.

    >>> numbers(np.arange(3), pa.int32()).to_pylist()
    [0, 1, 2]
    >>> numbers([True, False], pa.bool_()).to_pylist()
    [True, False]
    >>> numbers([0, 1, 2], pa.int64(), valid=np.array([True, False, True])).to_pylist()
    [0, None, 2]
    """
    if not (pa.types.is_integer(type) or pa.types.is_boolean(type)):
        raise ValueError(f"expected an integer or boolean type, got {type}")
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"expected 1-d values, got shape {array.shape}")
    if pa.types.is_boolean(type):
        data = _bits(array.astype(bool, copy=False))
    else:
        data = pa.py_buffer(np.ascontiguousarray(array, dtype=np.dtype(str(type))))
    valid = None if valid is None else np.asarray(valid, dtype=bool)
    nulls = 0 if valid is None else len(valid) - int(np.count_nonzero(valid))
    bitmap = _bits(valid) if valid is not None and nulls else None
    return pa.Array.from_buffers(type, len(array), [bitmap, data], null_count=nulls)


def strings(values: Sequence[str | None], large: bool = False) -> pa.Array:
    """``values`` as an Arrow string array (``None`` is null); ``large``: a large string
    array (offsets of 64 bits: over 2 GiB of text).

    >>> strings(["a", None, "bc"]).to_pylist(), strings(["d"], large=True).type
    (['a', None, 'bc'], DataType(large_string))
    """
    encoded = [b"" if value is None else value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(value) for value in encoded], out=offsets[1:])
    valid = np.fromiter((value is not None for value in values), bool, len(encoded))
    nulls = len(encoded) - int(np.count_nonzero(valid))
    bitmap = _bits(valid) if nulls else None
    data = pa.py_buffer(b"".join(encoded))
    if offsets[-1] < 1 << 31 and not large:
        return pa.Array.from_buffers(pa.string(), len(encoded), [bitmap, pa.py_buffer(offsets.astype(np.int32)), data])
    wide = pa.Array.from_buffers(pa.large_string(), len(encoded), [bitmap, pa.py_buffer(offsets), data])
    return wide if large else wide.cast(pa.string())  # (raises: a string array holds under 2 GiB)


def _bits(flags: np.ndarray) -> pa.Buffer:
    """Arrow's bitmap of ``flags``: bit ``i`` of the buffer is ``flags[i]``."""
    return pa.py_buffer(np.packbits(flags, bitorder="little"))


def to_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of an integer or boolean array without nulls, as numpy: a read-only view
    of the Arrow buffer (booleans unpacked into a copy); ``Array.to_numpy`` imports pandas.
    Other arrays are left to ``to_numpy``.

    >>> to_numpy(numbers([3, 4, 5], pa.int64())[1:]).tolist()
    [4, 5]
    >>> to_numpy(pa.chunked_array([numbers([True], pa.bool_()), numbers([False], pa.bool_())])).tolist()
    [True, False]
    """
    if isinstance(values, pa.ChunkedArray):
        dtype = bool if pa.types.is_boolean(values.type) else np.dtype(str(values.type))
        return np.concatenate([np.zeros(0, dtype), *map(to_numpy, values.chunks)])
    if not (pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
        return values.to_numpy(zero_copy_only=False)  # (not a build's: pandas may load)
    if values.null_count:
        raise ValueError("expected no nulls")
    data = values.buffers()[1]
    if pa.types.is_boolean(values.type):
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little", count=values.offset + len(values))
        return bits[values.offset :].astype(bool)
    dtype = np.dtype(str(values.type))
    return np.frombuffer(data, dtype, count=len(values), offset=values.offset * dtype.itemsize)


def scalar(value: int | bool | str, type: pa.DataType) -> pa.Scalar:
    """``value`` as an Arrow scalar of ``type`` (``pa.scalar`` imports pandas; so does a
    compute function given a Python value).

    >>> scalar("user", pa.string()).as_py(), scalar(0, pa.int32()).type
    ('user', DataType(int32))
    """
    if pa.types.is_string(type):
        return strings([str(value)])[0]
    return numbers([value], type)[0]


def filled(values: pa.Array, value: int | bool) -> pa.Array:
    """``values`` with each null replaced by ``value`` (``fill_null`` with a Python value
    imports pandas).

    >>> filled(pa.chunked_array([[1, None]]).chunk(0), 0).to_pylist()
    [1, 0]
    """
    import pyarrow.compute as pc  # (here: its import, ~30 ms, is not on a later build's path)

    return pc.coalesce(values, scalar(value, values.type))
