"""pledemo: per-layer-embedding kernels on the GPU.

Each kernel takes float32 sequences (array.array('f') or any buffer of 'f'
items; indices as 'i' items) and returns a new array.array('f'). Matrices are
flat, row-major, with `dim` items per row. The compiled extension is loaded on
first use, so the pure-Python modules import without a GPU build.
"""

from array import array

from pledemo._version import __version__

__all__ = ["__version__", "ple_gather", "row_scale", "row_sum", "saxpy"]


def _ops():
    from pledemo import _C

    return _C


def _items(buffer) -> int:
    return memoryview(buffer).nbytes // 4


def _check_dim(dim: int) -> None:
    if dim <= 0:
        raise ValueError(f"dim must be positive, got {dim}")


def _zeros(n: int) -> array:
    return array("f", bytes(4 * n))


def saxpy(a: float, x, y) -> array:
    """Return a * x + y."""
    out = _zeros(_items(x))
    _ops().saxpy(a, x, y, out)
    return out


def ple_gather(table, indices, dim: int) -> array:
    """Return the rows of `table` picked by `indices`, one after another."""
    _check_dim(dim)
    out = _zeros(_items(indices) * dim)
    _ops().ple_gather(table, dim, indices, out)
    return out


def row_scale(x, scales, dim: int) -> array:
    """Return x with row r multiplied by scales[r]."""
    _check_dim(dim)
    out = _zeros(_items(x))
    _ops().row_scale(x, scales, dim, out)
    return out


def row_sum(x, dim: int) -> array:
    """Return the sum of each row of x."""
    _check_dim(dim)
    out = _zeros(_items(x) // dim)
    _ops().row_sum(x, dim, out)
    return out
