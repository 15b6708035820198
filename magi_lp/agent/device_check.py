"""Device-check mode: do a node's arrays live where its resource spec says they should?

The plan decides each node's devices and hands them over as environment variables
(`JAX_PLATFORMS`, `CUDA_VISIBLE_DEVICES`, XLA's host device count). A node can still compute
elsewhere without failing: an array pulled as numpy and copied to the device at every call,
parameters left on another GPU, a library that put something on the CPU. Like rlstructures'
device-check wrapper, `DeviceCheck` asserts, at every policy call and learner update, that the
inputs and outputs are jax arrays on the node's declared devices (or host numpy where host
data is expected: observations, replay batches). A mismatch raises `DeviceMismatchError` with one
line naming the node, the array and both devices.

It is a debugging mode (`config.debug.check_devices=True`, off by default): walking every
leaf of the parameters costs microseconds per call, which an actor stepping a cheap
environment would notice.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection
from typing import Any

import jax
import numpy as np

from magi_lp.agent.data_parallel import describe_device

# JAX_PLATFORMS names -> jax.Device.platform.
_PLATFORM = {"cuda": "gpu", "gpu": "gpu", "rocm": "gpu", "cpu": "cpu", "tpu": "tpu"}


class DeviceMismatchError(RuntimeError):
    """An array of a checked node is not on the node's declared devices."""


def _describe(devices: Collection[jax.Device]) -> str:
    names = sorted(describe_device(d) for d in devices)
    return names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"


def declared_platform() -> str:
    """The platform this process was declared to compute on: the first of JAX_PLATFORMS.

    The plan writes JAX_PLATFORMS for every node ("cuda,cpu" on a GPU node, "cpu"
    elsewhere); a process it did not plan (a single-process run) declares JAX's default.
    """
    first = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    return _PLATFORM.get(first, jax.default_backend())


@dataclasses.dataclass(frozen=True)
class DeviceCheck:
    """Checks pytrees of arrays against one node's declared devices.

    Attributes:
      node: the node's name in messages ("learner", "actor 3").
      devices: the devices every checked device array must span exactly (the learner's
        arrays are replicated or split over all of its devices; an actor's live on one).
      declared: how the devices were declared, for messages ("JAX_PLATFORMS=cpu, 2 devices").
    """

    node: str
    devices: tuple[jax.Device, ...]
    declared: str = ""

    @classmethod
    def for_node(cls, node: str, *, all_devices: bool) -> DeviceCheck:
        """The check for this process's declared devices.

        Args:
          node: the node's name in messages.
          all_devices: True for a node that computes on every device it sees (the
            data-parallel learner), False for one that computes on the first (actors).

        Raises:
          DeviceMismatchError: JAX has no device of the declared platform at all.
        """
        platform = declared_platform()
        variable = os.environ.get("JAX_PLATFORMS", "")
        declared = f"JAX_PLATFORMS={variable}" if variable else f"JAX's default, {platform}"
        try:
            devices = jax.local_devices(backend=platform)
        except RuntimeError as error:
            raise DeviceMismatchError(
                f"device check: {node} is declared on {platform} ({declared}) but JAX has no "
                f"{platform} device: {' '.join(str(error).split())}"
            ) from None
        devices = tuple(devices) if all_devices else tuple(devices[:1])
        return cls(node, devices, declared)

    def check(self, what: str, tree: Any, *, host_ok: bool = False) -> None:
        """Every jax array in `tree` spans exactly `devices`; numpy only if `host_ok`.

        Args:
          what: names the tree in messages ("select_action input params").
          tree: any pytree; leaves that are neither jax nor numpy arrays (Python numbers,
            strings) are not checked.
          host_ok: host numpy arrays are expected here (observations, replay batches).

        Raises:
          DeviceMismatchError: one line naming the node, the leaf and both devices.
        """
        expected = set(self.devices)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if isinstance(leaf, jax.Array):
                found = leaf.devices()
                if found == expected:
                    continue
                where = _describe(found)
            elif isinstance(leaf, (np.ndarray, np.generic)):
                if host_ok:
                    continue
                where = "the host (numpy)"
            else:
                continue
            raise DeviceMismatchError(
                f"device check: {self.node}: {what}{jax.tree_util.keystr(path)} is on {where}, "
                f"but {self.node} is declared on {_describe(self.devices)} ({self.declared})"
            )
