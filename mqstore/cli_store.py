"""The command line's store opening and output (``mqstore.cli``): the config from
``$MQSTORE_CONFIG`` and ``--config`` (see mqstore.cli's docstring for the rules), the
store opened as writer or read-only, and results printed as text or JSON lines."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Final

import attrs

from mqstore import cli_dump, cli_verify
from mqstore.config import PROFILES, StoreConfig
from mqstore.store import MessageStore

__all__ = [
    "CONFIG_ENV",
    "STORE_ENV",
    "CliError",
    "NoProgress",
    "config_values",
    "dumps",
    "emit",
    "note",
    "open_store",
    "progress",
    "store_config",
    "table",
]

STORE_ENV: Final = "MQSTORE_STORE"
CONFIG_ENV: Final = "MQSTORE_CONFIG"  # KEY=VALUE pairs, space- or comma-separated
PROFILE_KEY: Final = "profile"  # profile=NAME: the settings of mqstore.config.PROFILES[NAME]


class CliError(Exception):
    """A user error: printed as one line, exit code 1."""


def config_values(
    args: argparse.Namespace, config_class: type, sources: dict[str, str] | None = None
) -> dict[str, Any]:
    """$MQSTORE_CONFIG, then --config: typed keyword arguments of an attrs config class,
    and in ``sources`` where each came from. ``profile=NAME`` (StoreConfig only) sets
    the profile's fields there. Keys of the other engine's config are skipped in
    $MQSTORE_CONFIG (one variable serves both engines); any other unknown or
    malformed item is refused, from either source."""
    fields = {field.name: field for field in attrs.fields(config_class) if field.init}
    from_env = os.environ.get(CONFIG_ENV, "").replace(",", " ").split()
    other_engine = _other_engine_settings(config_class) if from_env else frozenset()
    values: dict[str, Any] = {}
    for number, pair in enumerate([*from_env, *args.config]):
        source = f"${CONFIG_ENV} item" if number < len(from_env) else "--config"
        key, separator, raw = pair.partition("=")
        field = fields.get(key.strip())
        if source != "--config" and separator and key.strip() in other_engine:
            continue
        if separator and key.strip() == PROFILE_KEY and config_class is StoreConfig:
            profile = PROFILES.get(raw.strip())
            if profile is None:
                names = ", ".join(sorted(PROFILES))
                raise CliError(f"bad {source} {pair!r}: the profiles are {names}")
            values.update(profile)
            if sources is not None:
                sources.update(dict.fromkeys(profile, f"{source} {PROFILE_KEY}={raw.strip()}"))
            continue
        if not separator or field is None:
            keys = ", ".join(sorted(fields))
            raise CliError(f"bad {source} {pair!r}: use KEY=VALUE with KEY one of {keys}")
        default = field.default
        assert default is not attrs.NOTHING  # every config field has a plain default
        try:
            if isinstance(default, bool):
                if raw.lower() not in _BOOLEANS:
                    raise ValueError(raw)
                values[field.name] = _BOOLEANS[raw.lower()]
            else:
                values[field.name] = type(default)(raw)  # int, float or str
        except ValueError:
            kind = type(default).__name__
            raise CliError(f"bad {source} {pair!r}: {raw!r} is not a {kind}") from None
        if sources is not None:
            sources[field.name] = source
    return values


def _other_engine_settings(config_class: type) -> frozenset[str]:
    """Settings only the other engine's config has."""
    from mqstore.segmented.config import SegmentedConfig  # loaded only when needed

    other = SegmentedConfig if config_class is StoreConfig else StoreConfig
    names = {field.name for field in attrs.fields(other) if field.init}
    if other is StoreConfig:
        names.add(PROFILE_KEY)
    return frozenset(names - {field.name for field in attrs.fields(config_class)})


_BOOLEANS: Final = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def store_config(args: argparse.Namespace) -> StoreConfig:
    """StoreConfig from $MQSTORE_CONFIG and --config, with the layout the store
    recorded (or its files show). $MQSTORE_CONFIG is a shell-wide setting for the
    stores it creates, so an existing store's layout wins over it; a --config value
    that contradicts the layout is refused. Settings left out take the store's
    recorded defaults (``mqstore.layout``)."""
    sources: dict[str, str] = {}
    values = config_values(args, StoreConfig, sources)
    for name, found in cli_verify.disk_layout(args.store).items():
        given = values.get(name, found)
        if given != found and sources[name].startswith("--config"):
            setting = f"{name}={given}"
            if sources[name] != "--config":  # from a profile: name both
                setting = f"{sources[name].removeprefix('--config ')} ({setting})"
            raise CliError(
                f"--config {setting} does not match the store at {args.store}, created "
                f"with {name}={found}: the layout is fixed when a store is created (leave "
                "it out to adopt it)"
            )
        values[name] = found
    return StoreConfig(**values)


@contextlib.contextmanager
def open_store(args: argparse.Namespace, *, write: bool, replicated: bool = False) -> Iterator[Any]:
    """The store, opened as the writer or read-only (see the module docstring). A
    command that only reads never creates a store. ``replicated``: opened to lead
    followers (``MessageStore.open``'s argument)."""
    marker = "topics" if args.engine == "segmented" else "commitlog"
    if not write and not os.path.exists(os.path.join(args.store, marker)):
        raise CliError(
            f"no store at {args.store} (create one with 'mqstore topics create', or "
            f"pass --store or ${STORE_ENV})"
        )
    if args.engine == "segmented":  # the segmented engine has no read-only mode
        from mqstore.segmented import SegmentedConfig, SegmentedStore  # loaded only when needed

        config = SegmentedConfig(**config_values(args, SegmentedConfig))
        store: Any = SegmentedStore.open(args.store, config)
    else:
        store = MessageStore.open(
            args.store, store_config(args), read_only=not write, replicated=replicated
        )
    try:
        yield store
    finally:
        store.close()


def emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    """One result: a JSON line with --json, else ``text``."""
    print(dumps(cli_dump.to_json(data)) if args.json else text)


def table(args: argparse.Namespace, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    if args.json:
        for row in rows:
            print(dumps(cli_dump.to_json(row)))
        return
    cells = [[str(column).upper() for column in columns]]
    cells += [["-" if row.get(c) is None else str(row[c]) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


def note(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr)


class NoProgress:
    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress(args: argparse.Namespace, label: str, total: int, unit: str) -> Any:
    """A tqdm bar on stderr; nothing when stderr is not a terminal or with --quiet."""
    if args.quiet or args.json or not sys.stderr.isatty():
        return NoProgress()
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:  # progress is cosmetic
        return NoProgress()
    return tqdm(total=total, desc=label, unit=unit, unit_scale=True, file=sys.stderr, leave=False)
