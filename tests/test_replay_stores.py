"""Which store serves which agent (`replay.stores.resolve_store`), and the Reverb seam's
named error for an internal that is gone (`replay.reverb_seam`). No store is filled here:
only the choice, so these run in a second on both stacks."""

from __future__ import annotations

import importlib.machinery
import importlib.util

import ml_collections
import pytest

from magi_lp.errors import ConfigError
from magi_lp.replay import reverb_seam, stores
from magi_lp.replay.spec import TransitionReplaySpec
from magi_lp.replay.stores.agent_tables import AgentTables
from magi_lp.replay.stores.device import DeviceStore
from magi_lp.replay.stores.host import HostTransitions
from magi_lp.replay.stores.host_frames import HostFrameStore
from magi_lp.replay.stores.reverb_frames import ReverbFrameStore

FRAMES = object()
"""A pixel agent's frame_replay(None) answer: resolve_store only asks whether there is one."""
TRANSITIONS = TransitionReplaySpec(capacity=100, batch_size=4, n_step=1, discount=0.99)


class Builder:
    """The two questions resolve_store asks an agent's builder."""

    def __init__(self, frames=None, transitions=None):
        self._frames, self._transitions = frames, transitions

    def frame_replay(self, environment_spec):
        assert environment_spec is None  # asked before any environment exists
        return self._frames

    def transition_replay(self, environment_spec):
        assert environment_spec is None
        return self._transitions


def config(store: str) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"replay": {"store": store}})


@pytest.fixture(params=[True, False], ids=["reverb installed", "no reverb"])
def reverb_installed(request, monkeypatch) -> bool:
    """Both stacks' answers on either stack: whether `import reverb` would find it."""
    real = importlib.util.find_spec
    faked = ("launchpad", "reverb")  # the Launchpad stack (`magi_lp.stack.stack_here`)

    def find_spec(name, *args):
        if name not in faked:
            return real(name, *args)
        return importlib.machinery.ModuleSpec(name, None) if request.param else None

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return request.param


@pytest.mark.parametrize("single_process", [False, True], ids=["distributed", "one process"])
def test_a_pixel_agent_gets_the_store_replay_store_names(reverb_installed, single_process):
    builder = Builder(frames=FRAMES)
    chosen = {
        store: stores.resolve_store(builder, config(store), single_process=single_process)
        for store in ("device", "host", "reverb", "auto")
    }
    assert type(chosen["device"]) is DeviceStore
    assert type(chosen["host"]) is HostFrameStore
    assert type(chosen["reverb"]) is ReverbFrameStore
    # An unresolved 'auto' (a runner called without the entry points' plan): Reverb where
    # it is installed, the device store where it is not.
    assert type(chosen["auto"]) is (ReverbFrameStore if reverb_installed else DeviceStore)
    made = chosen["device"]
    assert made.builder is builder and made.single_process is single_process


def test_auto_is_one_rule_the_device_store_then_reverb_where_it_carries_then_the_host_store():
    rule = stores.auto_frame_store
    for reverb in (True, False):
        assert rule(device_fits=True, host_fits=True, reverb=reverb) == "device"
    for host_fits in (True, False):
        assert rule(device_fits=False, host_fits=host_fits, reverb=True) == "reverb"
    assert rule(device_fits=False, host_fits=True, reverb=False) == "host"
    assert rule(device_fits=False, host_fits=False, reverb=False) is None


def test_on_the_served_transport_a_pixel_agent_gets_a_store_without_reverb():
    builder = Builder(frames=FRAMES)
    served = {
        store: type(stores.resolve_store(builder, config(store), transport="served"))
        for store in ("device", "host", "auto")
    }
    assert served == {"device": DeviceStore, "host": HostFrameStore, "auto": DeviceStore}
    with pytest.raises(ConfigError, match="'device', 'host' or 'auto' where the engine"):
        stores.resolve_store(builder, config("reverb"), transport="served")


def test_a_state_agent_keeps_its_tables_unless_one_process_runs_without_reverb(
    reverb_installed,
):
    with_transitions = Builder(transitions=TRANSITIONS)
    one = {
        store: stores.resolve_store(with_transitions, config(store), single_process=True)
        for store in ("device", "reverb", "auto")
    }
    # In one process on the device store its transitions live in host memory...
    assert type(one["device"]) is HostTransitions
    assert type(one["auto"]) is (AgentTables if reverb_installed else HostTransitions)
    # ...and with Reverb asked for, or in a distributed program, in its own Reverb tables.
    assert type(one["reverb"]) is AgentTables
    distributed = stores.resolve_store(with_transitions, config("device"))
    assert type(distributed) is AgentTables


def test_an_agent_without_transition_replay_always_keeps_its_own_tables(reverb_installed):
    tables_only = Builder()
    for store in ("device", "reverb", "auto"):
        for single_process in (False, True):
            made = stores.resolve_store(tables_only, config(store), single_process=single_process)
            assert type(made) is AgentTables, (store, single_process)


# --- the Reverb seam --------------------------------------------------------------------------


def test_the_seam_names_a_missing_internal_in_one_runtime_error():
    class Client:  # a reverb.Client whose private pybind client went away in an upgrade
        pass

    with pytest.raises(RuntimeError) as missing:
        reverb_seam._require(Client(), "_client", "Client")
    assert str(missing.value) == (
        "reverb's Client no longer has _client; magi_lp supports dm-reverb 0.7.0 as pinned in "
        "requirements.txt (magi_lp/replay/reverb_seam.py lists what it relies on)."
    )
    # Through the function that needs it, one level down: the attribute and its owner named.
    client = Client()
    client._client = object()  # no NewSampler
    with pytest.raises(RuntimeError, match=r"^reverb's Client\._client no longer has NewSampler;"):
        reverb_seam.open_sampler(client, "frames", in_flight=1)


def test_the_seam_hands_back_what_is_there():
    class Inner:
        def NewSampler(self, table, max_samples, in_flight):  # noqa: N802 (Reverb's name)
            return (table, max_samples, in_flight)

    class Client:
        _client = Inner()

    assert reverb_seam._require(Client, "_client", "Client") is Client._client
    table, max_samples, in_flight = reverb_seam.open_sampler(Client(), "frames", in_flight=2)
    assert (table, in_flight) == ("frames", 2) and max_samples == 2**31 - 1
