"""What a store records about itself at creation: its layout and its defaults.

File ``<root>/layout`` (atomic JSON, checksummed like ``topics``), version 3::

    {"version": 3,
     "layout": {"commitlog_file_size_bytes": N, "consumequeue_units_per_file": N},
     "defaults": {"flush_mode": "async", "retention_hours": 72.0, "retention_bytes": -1},
     "checksum": "<xxh3_64 hex of the canonical JSON of {layout, defaults}>"}

Version 1 (no ``version`` key) holds only ``layout``, its checksum over ``layout``;
it is still read, and a writer rewrites it as the current version with its own
defaults. Version 2 has version 3's fields; a writer rewrites it as version 3 with
its recorded values. Version 3 says the CommitLog may hold append groups
(FLAG_GROUP_OPEN, mqstore.commitlog.record), a flag code before it reads as a
corrupt record and would cut the log at: it refuses the version instead.

Why: the two layout sizes are fixed per store (every CommitLog file and every
ConsumeQueue unit file has them), but a store's files do not always show them (a
store with topics and no queue file yet says nothing of its units per file), and a
reader needs the writer's flush mode and retention to describe the store. So any
process opens any store with ``MessageStore.open(path)``:

- layout: recorded by the first writer, fixed for the store's life. A setting the
  caller left out is adopted; an explicit value that differs is refused with a
  ConfigError naming it, before any file is touched.
- defaults: recorded by the first writer; adopted when the caller left them out. An
  explicit value overrides them for that open only and is not recorded (a service
  may run one process with ``flush_mode="sync"`` without changing the store's).

A store older than the record shows its CommitLog file size in its files: it is
adopted like a recorded one (such stores were made with 1 GiB files, the default
then; the default is now 128 MiB), and the writer records it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final

from mqstore.atomic import json_checksum, write_json_atomically
from mqstore.commitlog.errors import ConfigError, CorruptDataError
from mqstore.commitlog.mapped_file import file_name, parse_file_name
from mqstore.config import StoreConfig

__all__ = [
    "DEFAULT_FIELDS",
    "LAYOUT_FIELDS",
    "LAYOUT_FILE",
    "load_defaults",
    "load_layout",
    "resolve_config",
]

LAYOUT_FILE: Final = "layout"
VERSION: Final = 3
_WITH_DEFAULTS: Final = (2, VERSION)  # the versions that record defaults
LAYOUT_FIELDS: Final = ("commitlog_file_size_bytes", "consumequeue_units_per_file")
DEFAULT_FIELDS: Final = ("flush_mode", "retention_hours", "retention_bytes")


def _load(root: str) -> tuple[dict[str, int], dict[str, Any], int] | None:
    """(layout, defaults, version) as recorded, or None for a store that has none
    (new, or older than the record).

    Raises:
        CorruptDataError: the file does not parse, its checksum does not match, or a
            field is missing or invalid.
    """
    path = os.path.join(root, LAYOUT_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CorruptDataError(path, 0, f"unreadable layout: {error}") from None
    if not isinstance(document, dict):
        raise CorruptDataError(path, 0, "layout is not a JSON object")
    version = document.get("version", 1)
    layout = document.get("layout")
    defaults = document.get("defaults", {}) if version in _WITH_DEFAULTS else {}
    summed = {"layout": layout, "defaults": defaults} if version in _WITH_DEFAULTS else layout
    if version not in (1, *_WITH_DEFAULTS) or document.get("checksum") != json_checksum(summed):
        raise CorruptDataError(path, 0, f"layout version {version!r} or checksum do not match")
    if (
        not isinstance(layout, dict)
        or set(layout) != set(LAYOUT_FIELDS)
        or not all(type(value) is int and value > 0 for value in layout.values())
    ):
        raise CorruptDataError(path, 0, "layout fields do not match")
    if not isinstance(defaults, dict) or (
        version in _WITH_DEFAULTS and set(defaults) != set(DEFAULT_FIELDS)
    ):
        raise CorruptDataError(path, 0, "recorded defaults do not match")
    try:
        StoreConfig(**layout, **defaults)  # the recorded values validate as settings
    except ConfigError as error:
        raise CorruptDataError(path, 0, f"recorded setting is invalid: {error}") from None
    return layout, defaults, version


def load_layout(root: str) -> dict[str, int] | None:
    """The recorded layout, or None for a store that has none (new, or older).

    Raises:
        CorruptDataError: the file is damaged.
    """
    loaded = _load(root)
    return None if loaded is None else loaded[0]


def load_defaults(root: str) -> dict[str, Any]:
    """The recorded defaults ({} for a store without them).

    Raises:
        CorruptDataError: the file is damaged.
    """
    loaded = _load(root)
    return {} if loaded is None else loaded[1]


def _record(root: str, config: StoreConfig) -> None:
    layout = {name: getattr(config, name) for name in LAYOUT_FIELDS}
    defaults = {name: getattr(config, name) for name in DEFAULT_FIELDS}
    _write(root, layout, defaults)


def _write(root: str, layout: dict[str, int], defaults: dict[str, Any]) -> None:
    summed = {"layout": layout, "defaults": defaults}
    document = {"version": VERSION, **summed, "checksum": json_checksum(summed)}
    write_json_atomically(os.path.join(root, LAYOUT_FILE), document)


def resolve_config(root: str, config: StoreConfig, *, record: bool) -> StoreConfig:
    """``config`` with the store's recorded layout and defaults adopted for the
    settings the caller left out; with ``record`` (the writer), record what a new
    store (or a version 1 record) lacks.

    Returns:
        The config to open the store with.

    Raises:
        ConfigError: an explicit layout setting differs from the recorded one.
        CorruptDataError: the layout file is damaged.
    """
    loaded = _load(root)
    if loaded is None:
        shown = _layout_from_files(root)  # {} for a new store
        _refuse_conflicts(root, config, shown)
        adopted = config.adopting(shown)
        if record:
            _record(root, adopted)
        return adopted
    layout, defaults, version = loaded
    _refuse_conflicts(root, config, layout)
    adopted = config.adopting({**layout, **defaults})
    assert all(getattr(adopted, name) == layout[name] for name in LAYOUT_FIELDS)
    if record and version == 1:
        # A version 1 store never recorded its defaults: this writer's become them.
        _record(root, adopted)
    elif record and version != VERSION:  # what it recorded, marked for this code
        _write(root, layout, defaults)
    return adopted


def _refuse_conflicts(root: str, config: StoreConfig, layout: dict[str, int]) -> None:
    """Raise ConfigError for an explicit setting that differs from ``layout``."""
    for name, found in layout.items():
        given = getattr(config, name)
        if name in config.explicit_settings and given != found:
            raise ConfigError(
                f"StoreConfig({name}={given}) does not match the store at {root}, created "
                f"with {name}={found}: the layout is fixed when a store is created "
                "(leave the setting out to adopt it)"
            )


def _layout_from_files(root: str) -> dict[str, int]:
    """What a store without a record shows of its layout: the size of its oldest
    CommitLog file, when that is a valid setting ({} otherwise: the CommitLog's own
    open then names the bad file)."""
    directory = os.path.join(root, "commitlog")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    starts = [start for start in map(parse_file_name, names) if start is not None]
    if not starts:
        return {}
    try:
        size_bytes = os.path.getsize(os.path.join(directory, file_name(min(starts))))
        StoreConfig(commitlog_file_size_bytes=size_bytes)
    except (FileNotFoundError, ConfigError):  # removed meanwhile, or not a valid size
        return {}
    return {"commitlog_file_size_bytes": size_bytes}
