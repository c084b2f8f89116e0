"""Arrow arrays and tables built from their buffers, so that planning never imports pandas.

pyarrow imports pandas (when installed) the first time it converts Python or NumPy values:
`pa.array`, `pa.scalar`, `pa.Table.from_pydict`, a compute call given a Python value, even
`Array.to_numpy` (its pandas shim asks whether the object is a Series). That import cost a cold
dry run of the default study ~0.25 CPU-s, a tenth of it (issue 44). Arrays assembled with
`Array.from_buffers` from bytes and NumPy buffers, and compute calls whose operands are Arrow
arrays or scalars taken from them, never reach the shim: the parse-time samples table, shard
manifests and forget plans are built this way. The result equals `pa.array` of the same values
(`tests/plan/test_arrow_tables.py`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

_INT32_MAX = 2**31 - 1  # pa.string() offsets are int32


def string_array(values: Sequence[str]) -> pa.Array:
    """`pa.array(values, pa.string())` (no nulls), from an offsets buffer and a UTF-8 data buffer.

    Args:
        values: the strings.
    """
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)  # (n + 1,) byte offsets
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if offsets[-1] > _INT32_MAX:  # beyond pa.string()'s offsets: large_string, cast back (both valid)
        big = pa.Array.from_buffers(pa.large_string(), len(encoded),
                                    [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])
        return big.cast(pa.string())
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))])


def int64_array(values: Sequence[int] | np.ndarray) -> pa.Array:
    """`pa.array(values, pa.int64())` (no nulls), from a NumPy int64 buffer.

    Args:
        values: the integers.
    """
    data = np.ascontiguousarray(values, dtype=np.int64)  # (n,)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def bool_array(values: Sequence[bool] | np.ndarray) -> pa.Array:
    """`pa.array(values, pa.bool_())` (no nulls), from a bit-packed buffer (Arrow's bit order: LSB first).

    Args:
        values: the booleans.
    """
    bits = np.asarray(values, dtype=bool)  # (n,)
    return pa.Array.from_buffers(pa.bool_(), len(bits), [None, pa.py_buffer(np.packbits(bits, bitorder="little"))])


def string_scalar(value: str) -> pa.Scalar:
    """`pa.scalar(value, pa.string())`, for compute calls (`pc.equal(column, string_scalar("train"))`)."""
    return string_array([value])[0]


_BUILDERS = {pa.string(): string_array, pa.int64(): int64_array, pa.bool_(): bool_array}


def table_from_columns(columns: dict[str, Sequence], schema: pa.Schema) -> pa.Table:
    """`pa.Table.from_pydict(columns, schema=schema)` for string, int64 and bool columns without nulls.

    Args:
        columns: one sequence per field of `schema`, all of one length.
        schema: the table's schema; its field order is the table's.
    Raises:
        TypeError: a field of a type this module does not build.
    """
    arrays = []
    for field in schema:
        build = _BUILDERS.get(field.type)
        if build is None:
            raise TypeError(f"table_from_columns: field {field.name!r} has type {field.type}, not string, int64 or bool")
        arrays.append(build(columns[field.name]))
    return pa.Table.from_arrays(arrays, schema=schema)
