"""Stage-wise selection shared by the threshold policies (WAIT, Nested WAIT).

Both take "the ``n`` oldest requests at every stage" of some group of requests;
this is that operation, vectorised: one stable sort of the group keys.
"""

from __future__ import annotations

import numpy as np


def first_per_group(keys: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """Mask of the first ``limits[i]`` elements of each key, in input order.

    ``keys[i]`` names element ``i``'s group and ``limits[i]`` the number kept from
    that group (the same for every element of a group); earlier elements win.
    """
    if keys.size == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    new_group = np.ones(keys.size, dtype=bool)
    new_group[1:] = ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(new_group)
    rank = np.empty(keys.size, dtype=np.int64)
    rank[order] = np.arange(keys.size) - np.repeat(starts, np.diff(np.append(starts, keys.size)))
    return rank < limits
