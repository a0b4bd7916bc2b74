"""The one rule by which values reach a column (used by every writer:
``append``, ``insert_batch``, local and cluster alike).

A value is converted to the column's dtype only when nothing is lost:

* into an integer column: integers that fit its range, and floats that are
  whole numbers in that range (``1.0`` yes, ``1.5``, ``nan``, ``1e30`` no);
* into a bool column: bools, and numbers that are 0 or 1;
* into a float column: any bool, integer or float whose value does not
  overflow the column's range (``1e40`` into ``float32`` is refused); a
  float is rounded to the nearest value of the column (as ``float32(0.1)``
  is), and NaN and infinities stay what they are;
* into a ``bfloat16`` column: numbers as for a float column (rounded to
  nearest even), or ``uint16`` arrays (and ``ml_dtypes.bfloat16`` ones) as
  the raw bits.

Python numbers and lists, NumPy scalars and NumPy arrays all follow this
rule; anything else (strings, objects) is refused. A refused value raises
``gear.StepError`` naming the column and the first value that would change.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ConversionError(ValueError):
    """A value that would change in the column's dtype (becomes a StepError)."""


def _first_changed(src: np.ndarray, changed: np.ndarray) -> Any:
    index = np.flatnonzero(changed.ravel())[0]
    return src.ravel()[index].item()


def _bfloat16_bits(column: str, src: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        f32 = src.astype(np.float32)
    if not np.array_equal(np.isfinite(f32), np.isfinite(src)):
        raise ConversionError(f"column `{column}`: {_first_changed(src, np.isfinite(f32) != np.isfinite(src))!r} "
                              "overflows bfloat16")
    bits = f32.view(np.uint32).astype(np.uint64)
    # Round to nearest even on the 16 bits dropped; NaN stays a quiet NaN.
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    rounded = np.where(np.isnan(f32), np.uint16(0x7FC0), rounded)
    overflow = np.isfinite(f32) & ((rounded & 0x7F80) == 0x7F80)
    if overflow.any():
        raise ConversionError(f"column `{column}`: {_first_changed(src, overflow)!r} overflows bfloat16")
    return rounded


def to_column(value: Any, dtype: str, column: str) -> np.ndarray:
    """``value`` as an array of ``dtype`` (a NumPy dtype name, or
    ``"bfloat16"``), converted by the rule above; raises ConversionError."""
    try:
        src = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as e:
        raise ConversionError(f"column `{column}`: cannot read {value!r} as numbers ({e})") from None
    kind = src.dtype.kind
    if kind not in "biuf":
        raise ConversionError(f"column `{column}`: {value!r} is not numbers (dtype {src.dtype})")
    if dtype == "bfloat16":
        if src.dtype == np.uint16:
            return src
        return _bfloat16_bits(column, src)
    target = np.dtype(dtype)
    if src.dtype == target:
        return src
    with np.errstate(invalid="ignore", over="ignore"):
        out = src.astype(target)
        if target.kind == "f":
            changed = np.isfinite(src) & ~np.isfinite(out) if kind == "f" else ~np.isfinite(out)
            what = f"overflows {target}"
        else:
            changed = out.astype(src.dtype) != src
            if kind == "f":
                changed |= ~np.isfinite(src)
            if target.kind != "b" and kind in "iu":
                # A round trip can hide a wrap (uint64 -> int64 -> uint64).
                info = np.iinfo(target)
                changed |= (src < info.min) | (src > info.max)
            what = f"cannot be stored in {target} without loss"
    if changed.any():
        raise ConversionError(f"column `{column}`: {_first_changed(src, changed)!r} {what}")
    return out
