"""Where two nested configs differ, key by key, with both values: a study dir's spec against the
command's (mars.study.preflight) and the composed configs of a ladder's sizes (mars.study.budgets)."""

from __future__ import annotations

import math
from typing import Any


def differences(old: dict, new: dict, prefix: str = "study") -> list[str]:
    """Dotted keys where two specs differ, with both values."""
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        where = f"{prefix}.{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, where)
        elif (
            isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b) and a != b
        ):
            gone, added = [x for x in a if x not in b], [x for x in b if x not in a]
            change = [*(f"-{x}" for x in gone), *(f"+{x}" for x in added)]
            out.append(f"{where}: {' '.join(change) or 'the same items in another order'} now")
        elif not _same(a, b):
            out.append(f"{where}: {a!r} then, {b!r} now")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return a == b
