"""The C hot loops (commitlog/_native.c), when they were built.

``NATIVE`` is the module or None. commitlog/record.py picks the C or the pure-Python
version of each function from it; both follow the one format declared there, and the
tests run both. Environment switches:

- ``MQSTORE_PURE_PYTHON=1``: ignore the C module (to compare, or to debug).
- ``MQSTORE_REQUIRE_NATIVE=1``: fail at import when the C module is missing, so that
  a build that silently fell back does not pass for a fast one (``make test`` sets it).

The C file keeps its own copy of the record layout (header size, field offsets,
magics, the ConsumeQueue unit, the tail writer's table columns) and exports it as
``LAYOUT``. Each Python module that declares one of those formats hands its values to
``check_layout`` at import: a C module built from another version of the format is an
ImportError there, never a silent misread of the files.

Memory safety: every length, offset and index that reaches C is checked there, with
comparisons that cannot overflow (``size <= len and at <= len - size``, never
``at + size <= len``); a wrong argument is a ValueError or TypeError, and bytes read
from disk (records, ConsumeQueue units) are verified before use. The one trusted input
is the tail writer's table of raw mapping addresses (see ``write_units`` in the C
file). tests/commitlog/test_native_fuzz.py fuzzes every function with hostile
arguments, and scripts/sanitize.sh runs it under AddressSanitizer and UBSan.

The C of the record format is four files: _native.h (the layout, XXH64, the argument
helpers), _native.c (the encoders, the module), _scan.c (scan_records, verify_records,
gather: the checks of written records) and _columns.c (the columnar read: see
commitlog/columns.py). Only _columns.c makes Python objects per record (bytes,
views, rows, tuples: what it is for); its ``rows`` takes the rows it makes out of the
cyclic GC, which is sound because nothing can change a row's fields afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType

__all__ = ["NATIVE", "LayoutMismatchError", "check_layout"]


class LayoutMismatchError(ImportError):
    """The C module was built for another layout than the Python declaration."""


def check_layout(native: ModuleType, expected: Mapping[str, int], where: str) -> None:
    """Compare the C module's copy of a layout with its Python declaration.

    Args:
        native: the C module (``NATIVE``).
        expected: constant name -> value, as ``where`` declares them.
        where: the declaring module, for the message.

    Raises:
        LayoutMismatchError: a constant is missing from the C module or differs;
            the message names every one (rebuild the module, or fix the C copy).
    """
    layout = getattr(native, "LAYOUT", None)
    if not isinstance(layout, dict):
        raise LayoutMismatchError(
            f"{native.__name__} has no LAYOUT: it was built from an older _native.c; "
            "rebuild it (`pip install -e .`)"
        )
    wrong = [
        f"{name}: C {layout.get(name, 'missing')!r} != Python {value!r}"
        for name, value in expected.items()
        if layout.get(name) != value
    ]
    if wrong:
        raise LayoutMismatchError(
            f"{native.__name__} disagrees with {where} on the on-disk layout "
            f"({'; '.join(wrong)}): rebuild it, or fix commitlog/_native.c"
        )


def _load() -> ModuleType | None:
    if os.environ.get("MQSTORE_PURE_PYTHON") == "1":
        return None
    try:
        from mqstore.commitlog import _native  # type: ignore[attr-defined]
    except ImportError:
        if os.environ.get("MQSTORE_REQUIRE_NATIVE") == "1":
            raise ImportError(
                "mqstore.commitlog._native is not built (MQSTORE_REQUIRE_NATIVE=1): "
                "reinstall with a C compiler, `pip install -e .`"
            ) from None
        return None
    return _native


NATIVE: ModuleType | None = _load()
