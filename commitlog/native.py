"""The C hot loops (commitlog/_native.c), when they were built.

``NATIVE`` is the module or None. commitlog/record.py picks the C or the pure-Python
version of each function from it; both follow the one format declared there, and the
tests run both. Environment switches:

- ``MQSTORE_PURE_PYTHON=1``: ignore the C module (to compare, or to debug).
- ``MQSTORE_REQUIRE_NATIVE=1``: fail at import when the C module is missing, so that
  a build that silently fell back does not pass for a fast one (``make test`` sets it).
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["NATIVE"]


def _load() -> ModuleType | None:
    if os.environ.get("MQSTORE_PURE_PYTHON") == "1":
        return None
    try:
        from commitlog import _native  # type: ignore[attr-defined]
    except ImportError:
        if os.environ.get("MQSTORE_REQUIRE_NATIVE") == "1":
            raise ImportError(
                "commitlog._native is not built (MQSTORE_REQUIRE_NATIVE=1): "
                "reinstall with a C compiler, `pip install -e .`"
            ) from None
        return None
    return _native


NATIVE: ModuleType | None = _load()
