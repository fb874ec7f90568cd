"""KeyIndex against a Python dict: codes, growth, colliding probes, any int64 key but the reserved one."""

import numpy as np
import pytest

from ctrkit.preprocess.key_index import RESERVED, KeyIndex


def test_codes_match_a_dict_through_growth():
    rng = np.random.default_rng(0)
    index, reference = KeyIndex(capacity_bits=4), {}
    for _ in range(40):
        n = int(rng.integers(1, 3000))
        # power-law keys spread over the whole int64 range, negative ones and near-duplicates included
        keys = rng.zipf(1.3, n).astype(np.int64) * int(rng.integers(2, 1 << 40)) * rng.choice([-1, 1], n)
        keys = np.where(keys == RESERVED, 2, keys)
        codes = index.codes(keys)
        for key in sorted(set(keys.tolist()) - reference.keys()):  # new keys of one call: codes by value
            reference[key] = len(reference)
        np.testing.assert_array_equal(codes, [reference[k] for k in keys.tolist()])
    assert len(index) == len(reference) and index.keys.tolist() == list(reference)


class OneHomeIndex(KeyIndex):
    """Every key's probe starts at slot 0: the worst case for linear probing."""

    def _home(self, keys):
        return np.zeros(len(keys), dtype=np.int64)


def test_keys_sharing_a_home_slot():
    index = OneHomeIndex(capacity_bits=3)
    keys = np.arange(300, dtype=np.int64) * 7 + 2  # probes run past many windows of 8 slots
    np.testing.assert_array_equal(index.codes(keys[::-1]), np.arange(300)[::-1])  # new keys: codes by value
    np.testing.assert_array_equal(index.codes(keys), np.arange(300))
    np.testing.assert_array_equal(index.codes(np.array([2, 9999, 9])), [0, 300, 1])
    assert index.codes(np.array([], dtype=np.int64)).shape == (0,)


def test_reserved_key_is_refused():
    with pytest.raises(ValueError, match="1 is reserved"):
        KeyIndex().codes(np.array([5, RESERVED]))
