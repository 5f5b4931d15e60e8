"""CPU references of the pledemo kernels, for tests and for hosts without a GPU.

Same arguments and results as the functions in `pledemo`; arithmetic is done
in Python floats and rounded to float32 on the way out.
"""

from array import array


def saxpy(a: float, x, y) -> array:
    """Return a * x + y."""
    if len(x) != len(y):
        raise ValueError("x and y must have the same length")
    return array("f", (a * xi + yi for xi, yi in zip(x, y)))


def ple_gather(table, indices, dim: int) -> array:
    """Return the rows of `table` picked by `indices`, one after another."""
    rows = _rows(table, dim)
    out = array("f")
    for index in indices:
        if not 0 <= index < len(rows):
            raise IndexError(f"index {index} is outside the table's {len(rows)} rows")
        out.extend(rows[index])
    return out


def row_scale(x, scales, dim: int) -> array:
    """Return x with row r multiplied by scales[r]."""
    rows = _rows(x, dim)
    if len(scales) != len(rows):
        raise ValueError("scales must hold one value per row")
    return array("f", (v * s for row, s in zip(rows, scales) for v in row))


def row_sum(x, dim: int) -> array:
    """Return the sum of each row of x."""
    return array("f", (sum(row) for row in _rows(x, dim)))


def _rows(flat, dim: int) -> list:
    if dim <= 0 or len(flat) % dim:
        raise ValueError(f"length {len(flat)} is not a whole number of rows of {dim}")
    return [flat[start : start + dim] for start in range(0, len(flat), dim)]
