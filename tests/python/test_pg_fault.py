"""The test-only fault hook of mooncake-cpu (mooncake.pg._fault): its
rules and counting, without processes (the process scenarios are in
test_pg_elastic.py); and the point-to-point channels' ordering."""

from __future__ import annotations

import os
import threading
import time

import pytest

if os.environ.get("MOONCAKE_TEST_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401
else:
    pytest.importorskip("torch")

from mooncake.pg import _fault  # noqa: E402


def test_rules_parse():
    assert _fault.parse("fail:1>0@2; stall:0>3=0.5 ;refuse:2>1") == [
        _fault.Rule("fail", 1, 0, 2),
        _fault.Rule("stall", 0, 3, None, 0.5),
        _fault.Rule("refuse", 2, 1),
    ]
    assert _fault.parse("") == []


@pytest.mark.parametrize(
    "bad",
    ["drop:1>0", "fail:1-0", "fail:1>1", "fail:-1>0", "fail:1>0@0", "fail:1>0=2", "stall:1>0",
     "stall:1>0=-1", "refuse:1>0@2", "fail:a>0"],
)
def test_a_bad_rule_is_refused_with_its_text(bad):
    with pytest.raises(ValueError, match="MOONCAKE_PG_TEST_FAULT: bad rule"):
        _fault.parse(bad)


def test_only_the_nth_transfer_to_the_peer_fails():
    hook = _fault.Hook(_fault.parse("fail:1>0@2"))
    assert hook.transfer(1, [0, 2]) == []
    assert hook.transfer(1, [2]) == []
    assert hook.transfer(1, [0, 2]) == [0]
    assert hook.transfer(1, [0]) == []
    assert hook.injected == 1
    # Rules of another source rank never fire here.
    assert _fault.Hook(_fault.parse("fail:2>0")).transfer(1, [0]) == []


def test_a_stall_delays_the_transfer():
    hook = _fault.Hook(_fault.parse("stall:0>1=0.2"))
    t0 = time.monotonic()
    assert hook.transfer(0, [1]) == []
    assert time.monotonic() - t0 >= 0.2
    assert hook.injected == 1


def test_refuse_names_one_link():
    hook = _fault.Hook(_fault.parse("refuse:0>1"))
    assert hook.refuses(0, 1) and not hook.refuses(1, 0) and not hook.refuses(0, 2)
    assert hook.injected == 1


def test_the_hook_is_off_without_its_variable(monkeypatch):
    monkeypatch.delenv(_fault.ENV, raising=False)
    assert _fault.hook() is None
    monkeypatch.setenv(_fault.ENV, "fail:1>0")
    assert _fault.hook() is _fault.hook() is not None
    monkeypatch.setenv(_fault.ENV, "fail:")
    with pytest.raises(ValueError):
        _fault.hook()


# -- the point-to-point channels (mooncake.pg._channels) ----------------------
def test_a_shared_operation_runs_once_and_after_the_one_before():
    from mooncake.pg._channels import Channels

    ch = Channels("test")
    gate, log = threading.Event(), []
    first = ch.submit_shared(0, lambda: (gate.wait(30), log.append(1)))
    # Taken by the peer's thread, which now blocks on the gate.
    deadline = time.monotonic() + 30
    while not first._taken:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = ch.submit_shared(0, lambda: log.append(2) or 2)
    threading.Timer(0.2, gate.set).start()
    # The waiter takes the second one but runs it only after the first.
    assert second.result() == 2
    assert log == [1, 2]
    # Nobody waits for the third: the peer's thread runs it all the same.
    third = ch.submit_shared(0, lambda: log.append(3))
    ch.drain()
    assert third.done() and log == [1, 2, 3]
    ch.shutdown(wait=True)
