"""MessageStore.put in one C call (mqstore/_put.c, the Putter) against its pure-Python
twin, the method ``MessageStore.put``: the same records, results and errors, the
cases it must leave to the method, and hostile state."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import (
    DispatchFailedError,
    InvalidArgumentError,
    InvalidTypeError,
    LimitExceededError,
    MessageStore,
    StoreClosedError,
    StoreConfig,
    UnknownTopicError,
)
from mqstore.commitlog.native import NATIVE
from tests.mqstore.conftest import SMALL

native = pytest.mark.skipif(NATIVE is None, reason="mqstore.commitlog._native is not built")


class Clock:
    """A store clock every store of a test reads the same way."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


def _open(path: Any, **config: Any) -> MessageStore:
    settings_ = {**SMALL, "auto_create_topics": False, **config}
    store = MessageStore.open(path, StoreConfig(**settings_), clock_ms=Clock())
    store.create_topic("orders", 3)
    store.create_topic("a", 1)
    return store


def _log_bytes(store: MessageStore) -> bytes:
    directory = os.path.join(store.root, "commitlog")
    end = store.commitlog.write_position
    out = b""
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as file:
            out += file.read()
    return out[:end]


@native
def test_an_async_store_puts_in_c_and_a_sync_one_through_the_method(tmp_path) -> None:
    store = _open(tmp_path / "async")
    try:
        assert type(store.put).__name__ == "builtin_function_or_method"
        assert store.put.__self__ is store._putter
        assert store._putter.enabled
    finally:
        store.close()
    assert "put" not in vars(store)  # closing gives put back to the method
    assert store._putter is None
    sync = _open(tmp_path / "sync", flush_mode="sync")
    try:
        assert sync.put.__func__ is MessageStore.put
    finally:
        sync.close()


_queues = st.sampled_from([("orders", 0), ("orders", 2), ("a", 0)])
_bodies = st.binary(max_size=200) | st.none() | st.binary(max_size=20).map(bytearray)
_options = st.fixed_dictionaries(
    {},
    optional={
        "tag": st.none() | st.sampled_from(["", "t", "é" * 5]),
        "born_timestamp_ms": st.none() | st.integers(0, 2**40),
        "keys": st.sampled_from([(), [], "", None, ["k1"], "k2"]),
        "properties": st.sampled_from([None, {}, {"p": "v"}]),
    },
)
_puts = st.lists(st.tuples(_queues, _bodies, _options), min_size=1, max_size=30)


@native
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_puts)
def test_the_c_put_writes_what_the_method_writes(tmp_path_factory, puts) -> None:
    """The same puts through the Putter and through the method (with the same clock)
    return the same results and leave the same log bytes and messages."""
    root = tmp_path_factory.mktemp("twins")
    fast, slow = _open(root / "fast"), _open(root / "slow")
    handed_over, topics_seen = 0, set()
    try:
        for (topic, queue_id), body, options in puts:
            got = fast.put(topic, queue_id, body, **options)
            want = MessageStore.put(slow, topic, queue_id, body, **options)
            assert got == want and type(got) is type(want)
            plain = options.get("keys") in ((), [], "", None) and not options.get("properties")
            handed_over += not plain or topic not in topics_seen  # the method's puts
            topics_seen.add(topic)
        assert fast._putter.slow_calls == handed_over  # every other put was C's alone
        assert _log_bytes(fast) == _log_bytes(slow)
        for topic, queue_id in (("orders", 0), ("orders", 2), ("a", 0)):
            mine = [(m.body, m.tag, m.keys) for m in fast.get(topic, queue_id, 0, 100)]
            theirs = [(m.body, m.tag, m.keys) for m in slow.get(topic, queue_id, 0, 100)]
            assert mine == theirs
    finally:
        fast.close()
        slow.close()


_BAD_CALLS: list[tuple[tuple[Any, ...], dict[str, Any], type[BaseException]]] = [
    (("orders", 3, b"x"), {}, UnknownTopicError),  # past the partitions
    (("nope", 0, b"x"), {}, UnknownTopicError),
    (("orders", True, b"x"), {}, InvalidTypeError),
    (("orders", -1, b"x"), {}, InvalidArgumentError),
    (("orders", 0, "text"), {}, InvalidTypeError),
    (("orders", 0, b"x"), {"tag": 7}, InvalidTypeError),
    (("orders", 0, b"x"), {"tag": "x" * 256}, LimitExceededError),
    (("orders", 0, b"x"), {"born_timestamp_ms": -5}, InvalidArgumentError),
    (("orders", 0, b"x" * (300 * 1024)), {}, LimitExceededError),
    (("orders", 0, b"x"), {"colour": "red"}, TypeError),
    (("orders", 0), {}, TypeError),
    (("orders", 0, b"x", "extra"), {}, TypeError),
]


@native
@pytest.mark.parametrize(("args", "kwargs", "error"), _BAD_CALLS)
def test_what_the_c_put_refuses_the_method_refuses_alike(tmp_path, args, kwargs, error) -> None:
    """Every refusal is the method's own: the same type and message, nothing written."""
    fast, slow = _open(tmp_path / "fast"), _open(tmp_path / "slow")
    try:
        fast.put("orders", 0, b"checked")  # the queue is on the C path from here
        MessageStore.put(slow, "orders", 0, b"checked")
        with pytest.raises(error) as got:
            fast.put(*args, **kwargs)
        with pytest.raises(error) as want:
            MessageStore.put(slow, *args, **kwargs)
        assert str(got.value) == str(want.value)
        assert fast.commitlog.write_position == slow.commitlog.write_position
    finally:
        fast.close()
        slow.close()


@native
def test_keys_and_properties_go_through_the_method_and_are_found(tmp_path) -> None:
    store = _open(tmp_path / "s")
    try:
        store.put("orders", 1, b"plain")
        store.put("orders", 1, b"keyed", keys=["order-7"], properties={"k": "v"})
        (found,) = store.query_by_key("orders", "order-7")
        assert bytes(found.body) == b"keyed"
        assert [bytes(m.body) for m in store.get("orders", 1, 0, 10)] == [b"plain", b"keyed"]
    finally:
        store.close()


@native
def test_a_failed_dispatcher_and_a_closed_store_refuse_on_the_c_path(tmp_path) -> None:
    store = _open(tmp_path / "s")
    put = store.put  # held across the close, as a service might
    put("orders", 0, b"x")
    dispatcher = store._dispatcher
    assert dispatcher is not None
    dispatcher.failure = DispatchFailedError(0, "injected")
    with pytest.raises(DispatchFailedError):
        put("orders", 0, b"y")
    dispatcher.failure = None
    put("orders", 0, b"z")
    store.close()
    with pytest.raises(StoreClosedError):
        put("orders", 0, b"after")


@native
def test_a_replicated_wait_turns_the_c_path_off_and_back_on(tmp_path) -> None:
    store = _open(tmp_path / "s")
    waited: list[int] = []
    try:
        store.put("orders", 0, b"a")
        store.set_replicated_wait(waited.append)
        assert not store._putter.enabled
        store.put("orders", 0, b"b")
        assert waited == [store.commitlog.write_position]
        store.set_replicated_wait(None)
        assert store._putter.enabled
        store.put("orders", 0, b"c")
        assert len(waited) == 1
    finally:
        store.close()


@native
def test_a_subclass_that_overrides_put_keeps_its_put(tmp_path) -> None:
    class Audited(MessageStore):
        seen = 0

        def put(self, *args: Any, **kwargs: Any) -> Any:
            Audited.seen += 1
            return super().put(*args, **kwargs)

    store = Audited.open(tmp_path / "s", StoreConfig(**SMALL))
    try:
        store.put("t", 0, b"x")
        assert Audited.seen == 1 and store._putter is None
    finally:
        store.close()


class _Holder:
    failure: Any = None


def _putter(tmp_path: Any, **parts: Any) -> tuple[Any, MessageStore, list[Any]]:
    """A Putter over a real store's appender, with recording parts."""
    assert NATIVE is not None
    store = _open(tmp_path / "s")
    store.put("orders", 0, b"checked")
    slow_calls: list[Any] = []

    def slow(*args: Any, **kwargs: Any) -> str:
        slow_calls.append((args, kwargs))
        return "slow"

    values = {
        "appender": store.commitlog._appender,
        "limits": {"orders": 3},
        "holder": _Holder(),
        "slow": slow,
        "help": lambda position: None,
        **parts,
    }
    putter = NATIVE.Putter(**values)
    putter.enabled = True
    return putter, store, slow_calls


@native
def test_hostile_putter_state_goes_slow_or_raises_never_writes_wild(tmp_path) -> None:
    for limits in ({"orders": "3"}, {"orders": -1}, {"orders": 2**70}, {"orders": 0}):
        putter, store, slow_calls = _putter(tmp_path / str(len(os.listdir(tmp_path))),
                                            limits=limits)  # fmt: skip
        try:
            before = store.commitlog.write_position
            assert putter.put("orders", 0, b"x") == "slow"
            assert store.commitlog.write_position == before
            assert slow_calls == [(("orders", 0, b"x"), {})]
        finally:
            store.close()
    putter, store, _ = _putter(tmp_path / "holder", holder=object())
    try:
        with pytest.raises(AttributeError):  # as the method's own look-up would
            putter.put("orders", 0, b"x")
    finally:
        store.close()
    with pytest.raises(TypeError):
        NATIVE.Putter(object(), {}, _Holder(), print, print)  # type: ignore[union-attr]


@native
def test_the_help_hook_runs_past_its_position_and_its_error_follows_the_append(tmp_path):
    helped: list[int] = []

    def help_(position: int) -> None:
        helped.append(position)
        if len(helped) == 2:
            raise RuntimeError("injected")

    putter, store, _ = _putter(tmp_path, help=help_)
    try:
        putter.help_past = 2**62
        putter.put("orders", 0, b"quiet")
        assert helped == []
        putter.help_past = -1
        first = putter.put("orders", 0, b"helped")
        assert helped == [first.physical_offset]
        end = store.commitlog.write_position
        with pytest.raises(RuntimeError, match="injected"):
            putter.put("orders", 0, b"appended all the same")
        assert store.commitlog.write_position > end
    finally:
        store.close()


def test_a_str_subclass_topic_and_an_int_subclass_queue_id_are_dispatched(tmp_path) -> None:
    """Regression (review of the one-call put): the general path put the caller's own
    topic and queue id objects in the dispatcher's feed, whose C reader takes only an
    exact str and int; one IntEnum queue id stopped dispatch for the whole store (the
    dispatcher retried the round forever), then failed puts past the backlog."""
    import enum
    import time

    class Queue(enum.IntEnum):
        FIRST = 0

    class Topic(str):
        pass

    store = _open(tmp_path / "s")
    try:
        for i in range(300):
            store.put(Topic("orders"), Queue.FIRST, b"m%d" % i)
        deadline = time.monotonic() + 10
        while store.max_offset("orders", 0) < 300:
            assert time.monotonic() < deadline, "not dispatched"
            time.sleep(0.005)
        assert [bytes(m.body) for m in store.get("orders", 0, 298, 5)] == [b"m298", b"m299"]
    finally:
        store.close()


@native
def test_put_has_the_methods_signature_and_close_keeps_a_users_wrapper(tmp_path) -> None:
    import inspect

    store = _open(tmp_path / "s")

    def shape(function: Any) -> list[tuple[str, Any, Any]]:
        parameters = inspect.signature(function).parameters.values()
        return [(p.name, p.kind, p.default) for p in parameters]

    assert shape(store.put) == shape(MessageStore.put.__get__(store, MessageStore))
    calls: list[Any] = []
    fast = store.put

    def audited(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return fast(*args, **kwargs)

    store.put = audited  # type: ignore[method-assign]
    store.put("orders", 0, b"x")
    store.close()
    assert store.put is audited and len(calls) == 1
