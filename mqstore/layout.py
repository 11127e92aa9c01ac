"""The store's layout: the StoreConfig fields its files are built with.

File ``<root>/layout`` (atomic JSON, checksummed like ``topics``)::

    {"layout": {"commitlog_file_size_bytes": N, "consumequeue_units_per_file": N},
     "checksum": "<xxh3_64 hex of the canonical JSON of 'layout'>"}

Why: these two sizes are fixed per store (every CommitLog file and every ConsumeQueue
unit file has them), but a store's files do not always show them: a store with topics
and no queue file yet says nothing of its units per file. A process that opens the
store without the writer's config (a Spark task, the CLI) then guessed the default
and built queue files of the wrong size. The writer records the layout at open; a
reader takes it from here; an open with a config that disagrees is refused with a
ConfigError naming the field, before any file is touched.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

from commitlog.errors import ConfigError, CorruptDataError
from mqstore.atomic import json_checksum, write_json_atomically

__all__ = ["LAYOUT_FIELDS", "LAYOUT_FILE", "check_layout", "load_layout"]

LAYOUT_FILE: Final = "layout"
LAYOUT_FIELDS: Final = ("commitlog_file_size_bytes", "consumequeue_units_per_file")


def load_layout(root: str) -> dict[str, int] | None:
    """The recorded layout, or None for a store that has none (new, or older).

    Raises:
        CorruptDataError: the file does not parse or its checksum does not match.
    """
    path = os.path.join(root, LAYOUT_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CorruptDataError(path, 0, f"unreadable layout: {error}") from None
    body = document.get("layout") if isinstance(document, dict) else None
    if (
        not isinstance(body, dict)
        or document.get("checksum") != json_checksum(body)
        or set(body) != set(LAYOUT_FIELDS)
        or not all(type(value) is int and value > 0 for value in body.values())
    ):
        raise CorruptDataError(path, 0, "layout checksum or fields do not match")
    return body


def check_layout(root: str, config: Any, *, record: bool) -> None:
    """Refuse a config whose layout differs from the recorded one; with ``record``
    (the writer), record the config's layout when none is recorded yet.

    Raises:
        ConfigError: ``config`` disagrees with the store's layout.
        CorruptDataError: the layout file is damaged.
    """
    wanted = {name: getattr(config, name) for name in LAYOUT_FIELDS}
    recorded = load_layout(root)
    if recorded is None:
        if record:
            write_json_atomically(
                os.path.join(root, LAYOUT_FILE),
                {"layout": wanted, "checksum": json_checksum(wanted)},
            )
        return
    for name in LAYOUT_FIELDS:
        if recorded[name] != wanted[name]:
            raise ConfigError(
                f"the store at {root} was created with {name}={recorded[name]}; "
                f"StoreConfig.{name}={wanted[name]} does not match (open it with the same value)"
            )
