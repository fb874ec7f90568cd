"""The Criteo preprocessing recipe, as one definition every engine executes.

Input lines: ``label \\t I1..I13 \\t C1..C26`` (integers may be negative; categories are hex hashes;
an empty field is a missing value). Output: a split-binary dataset.

* numerical x -> log(max(x, -2) + 3), missing -> 0. This is NVIDIA's Spark recipe for every integer
  (Criteo's -1..-3 included) without its log(0): -3 is clipped to -2, giving log(1) = 0.
* categorical values seen fewer than ``frequency_threshold`` times in the train split share the
  "rare" id 1; the others get contiguous ids from 2 in order of descending train frequency, ties
  broken by the raw value; id 0 is missing or unseen. The test split uses the train vocabulary:
  a value never seen in train maps to 0, never to an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ctrkit.data.feature_spec import check_capacity
from ctrkit.field_types import FRACTION, FREQUENCY_THRESHOLD

CRITEO_SOURCE = "ctrkit preprocess criteo"  # what made a dataset, as its preprocessing record names it
# the columns of Criteo's day files (tab-separated, no header; a test day's records leave the label out)
CRITEO_FILE_COLUMNS = ("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)))
MISSING_ID = 0  # an empty field, or a value the train split never had
RARE_ID = 1  # a value seen fewer than frequency_threshold times in the train split
FIRST_ID = 2  # the most frequent value


@dataclass(frozen=True)
class CriteoRecipe:
    """Parameters of the recipe.

    Attributes:
        num_numerical: integer columns after the label (13 for Criteo).
        num_categorical: hashed categorical columns after them (26 for Criteo).
        frequency_threshold: FL; values seen fewer times in the train split become the rare id.
        raw_ids: categorical columns kept as raw 64-bit ids (dynamic features, ``models/dynamic.py``) instead of
            vocabulary ids: each value's key (``vocabulary.key_expr``: exact for Criteo's hexadecimal values; 0 for
            the missing value).
        capacity: rows of each raw-id column's table (None: its vocabulary's cardinality at ``frequency_threshold``,
            the rows a vocabulary table would have).
    """

    num_numerical: int = 13
    num_categorical: int = 26
    frequency_threshold: int = 3
    raw_ids: tuple[str, ...] = ()
    capacity: int | None = None

    def validate(self) -> None:
        names = [self.field_name(i) for i in range(1 + self.num_numerical, self.num_fields)]
        unknown = [c for c in self.raw_ids if c not in names]
        if unknown:
            raise ValueError(f"`raw_ids`: no categorical column {unknown[0]!r}; expected some of {', '.join(names)}")
        check_capacity(self.capacity)
        if self.num_numerical < 0 or self.num_categorical < 1:
            raise ValueError(
                f"expected >= 0 numerical and >= 1 categorical columns, got {self.num_numerical} and "
                f"{self.num_categorical}"
            )
        FREQUENCY_THRESHOLD.check("frequency_threshold", self.frequency_threshold)

    @property
    def num_fields(self) -> int:
        return 1 + self.num_numerical + self.num_categorical

    def field_name(self, i: int) -> str:
        """Criteo's column names: label, I1..I13, C1..C26."""
        if i == 0:
            return "label"
        if i <= self.num_numerical:
            return f"I{i}"
        return f"C{i - self.num_numerical}"


BAD_ROW_POLICIES = ("error", "skip")


def check_arguments(
    recipe: CriteoRecipe,
    raw_files: Sequence[object],
    test_files: Sequence[object] | None,
    test_fraction: float | None,
    bad_rows: str,
    validation_fraction: float | None = None,
) -> None:
    """The checks every engine makes before reading anything."""
    recipe.validate()
    if bad_rows not in BAD_ROW_POLICIES:
        raise ValueError(f"`bad_rows` must be one of {', '.join(BAD_ROW_POLICIES)}, got {bad_rows!r}")
    if not raw_files:
        raise ValueError("no input files given")
    if (test_files is None) == (test_fraction is None):
        raise ValueError("give exactly one of `test_files` and `test_fraction`")
    if test_fraction is not None:
        FRACTION.check("test_fraction", test_fraction, integer=False)
    if validation_fraction is not None:
        FRACTION.check("validation_fraction", validation_fraction, integer=False)


def _log_transform(ints: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(ints, -2).astype(np.float64) + 3.0).astype(np.float16)


_TABLE = _log_transform(np.arange(-2, 1 << 16))  # the transform of every integer from -2 to 65,535


def numerical_transform(ints: np.ndarray) -> np.ndarray:
    """log(max(x, -2) + 3) as float16, for integers with missing values already set to -2 (-> 0).

    Integers below 65,536 (nearly all of Criteo's) are looked up in a table of the same function's
    results, which is twice as fast as computing logarithms and half-precision conversions per value.
    """
    index = np.maximum(ints, -2) + 2  # (n, N)
    big = index >= len(_TABLE)
    np.minimum(index, len(_TABLE) - 1, out=index)
    out = _TABLE.take(index)
    if big.any():
        out[big] = _log_transform(ints[big])
    return out
