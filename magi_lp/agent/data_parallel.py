"""Data-parallel learning over the identical devices a learner process sees.

A learner node sees exactly the devices its resource spec gave it: `resources.learner.gpus: n`
(the plan checks that they are one model), or `cpu_devices: n` host devices on a CPU. When it
sees more than one, `JaxLearner` runs the agent's own jitted `update(state, batch)` over all of
them through this module: each batch is split along its first axis, one shard per device;
the training state is replicated; the update is compiled once for the whole device mesh.

How: `jax.sharding` (GSPMD), not `pmap`. The agent's update is jitted again with the state
replicated and the batch sharded over a one-axis `Mesh`; XLA's SPMD partitioner then runs
each device on its shard and inserts the all-reduce that averages gradients (a mean-reduced
loss over a sharded batch), so the parameters and optimizer state it returns are replicated
and identical on every device. Why this over pmap:
- no agent code: pmap runs the update once per device on its shard, so the agent must
  `pmean` its gradients itself (a hook in every agent) and give each device its own random
  numbers; here the program is the agent's, unchanged;
- the same random numbers: the partitioned program computes exactly what the one-device
  program computes (augmentation shifts, target noise from the replicated key), so a
  2-device update equals the 1-device update on the same batch up to float summation order,
  which tests/test_data_parallel.py checks for DrQ-v2 and TD3;
- the state stays one logical array per leaf: checkpoints, `get_variables` and restore see
  the same pytree as on one device;
- it works on jax 0.4.30 and on current JAX, where pmap is being folded into jit.
The cost to watch: an op the partitioner cannot split by batch makes it gather whole arrays
between devices. DrQ-v2's random shift is written as a batch-parallel gather for this reason
(projects/drq_v2/augmentations.py); `compiled_collectives` lists what a program exchanges.

The batch must divide by the device count; the plan refuses a config where
`agent.batch_size` does not (`magi_lp.runtime.config.placement_requests`), and `put_batch`
refuses any other batch in one line.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError

BATCH_AXIS = "batch"
"""The mesh axis the batch is split along."""


def describe_device(device: jax.Device) -> str:
    """`cpu:0`, `gpu:1`: a device as the plan's words name it (platform and JAX id)."""
    return f"{device.platform}:{device.id}"


class DataParallel:
    """An update run data-parallel over `devices`: batch split, state replicated."""

    def __init__(self, devices: Sequence[jax.Device], *, node: str = "learner"):
        """Creates the mesh.

        Args:
          devices: two or more devices of one kind (one model of GPU, or host devices).
          node: the node's name, for error messages.

        Raises:
          ConfigError: the devices are not all of one kind (pmap's rule, kept here: XLA
            compiles one program for all of them).
        """
        devices = tuple(devices)
        kinds = collections.Counter(f"{d.platform} {d.device_kind}" for d in devices)
        if len(kinds) > 1:
            found = ", ".join(f"{describe_device(d)} {d.device_kind}" for d in devices)
            raise ConfigError(
                fact_refusal(
                    f"{node} sees devices of different models ({found})",
                    "a data-parallel update needs identical ones",
                    "give it GPUs of one model (resources.<group>.gpus), or set "
                    "CUDA_VISIBLE_DEVICES to identical GPUs for a single-process run",
                )
            )
        self.devices = devices
        self.node = node
        self.mesh = Mesh(np.array(devices), (BATCH_AXIS,))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        """Every device holds the whole array (the training state, metrics)."""
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec(BATCH_AXIS))
        """Device i holds rows [i * B/n, (i + 1) * B/n) of a batch leaf."""

    def describe(self) -> str:
        """One line for the node's log: the devices and how the batch is split."""
        kind = self.devices[0].device_kind
        names = ", ".join(describe_device(d) for d in self.devices)
        return (
            f"data-parallel over {self.num_devices} devices ({names}; {kind}): each batch "
            f"split {self.num_devices} ways, state replicated"
        )

    @property
    def num_devices(self) -> int:
        """How many devices each batch is split over."""
        return len(self.devices)

    def put_state(self, state: Any) -> Any:
        """The state replicated on every device (a no-op for a state already placed so)."""
        return jax.device_put(state, self.replicated)

    def put_batch(self, batch: Any) -> Any:
        """The batch split along its first axis, one shard per device.

        Host (numpy) leaves are copied to the devices shard by shard; device arrays placed
        elsewhere are moved; leaves already sharded this way stay as they are. Scalars are
        replicated.

        Raises:
          ConfigError: a leaf's first dimension does not divide by the device count.
        """
        with_paths, treedef = jax.tree_util.tree_flatten_with_path(batch)
        leaves = [leaf for _, leaf in with_paths]
        shardings = []
        for path, leaf in with_paths:
            shape = np.shape(leaf)
            if not shape:
                shardings.append(self.replicated)
                continue
            if shape[0] % self.num_devices:
                raise ConfigError(
                    fact_refusal(
                        f"{self.node}: a batch of {shape[0]} (batch"
                        f"{jax.tree_util.keystr(path)}) does not split evenly over its "
                        f"{self.num_devices} devices",
                        "",
                        f"make the agent's batch size a multiple of {self.num_devices}, or "
                        "give the learner a device count that divides it",
                    )
                )
            shardings.append(self.batch_sharding)
        placed = jax.device_put(leaves, shardings)
        return jax.tree_util.tree_unflatten(treedef, placed)

    def wrap(self, update: Callable[..., tuple[Any, Any]]) -> Callable[..., tuple[Any, Any]]:
        """`update(state, batch, ...)` run over the mesh; what it returns is replicated.

        The state must have been placed with `put_state` (the returned state is, so a learner
        that feeds each update's state to the next one places it once).
        """
        compiled = jax.jit(update, out_shardings=self.replicated)

        def data_parallel_update(state: Any, batch: Any, *args: Any, **kwargs: Any):
            return compiled(state, self.put_batch(batch), *args, **kwargs)

        data_parallel_update.compiled = compiled  # for compiled_collectives and tests
        return data_parallel_update


def local_data_parallel(node: str = "learner") -> DataParallel | None:
    """Data parallelism over every device of JAX's default backend in this process.

    In a distributed run these are the devices the plan gave the node (its GPUs, or its
    `cpu_devices`); in a single-process run, what the process sees. None with one device:
    the update then runs as the agent wrote it.
    """
    devices = jax.local_devices()
    if len(devices) < 2:
        return None
    return DataParallel(devices, node=node)


def compiled_collectives(compiled_update: Any, *args: Any) -> dict[str, int]:
    """How many of each cross-device operation the compiled program runs (by HLO op name).

    For checking that a program splits by batch: a data-parallel update should exchange
    gradients (all-reduce) and little else; an `all-gather` of activations means an op the
    partitioner could not split.
    """
    text = compiled_update.lower(*args).compile().as_text()
    names = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
    counts = {}
    for name in names:
        counts[name] = len(re.findall(rf"= [^=]*\b{name}(?:-start)?\(", text))
    return counts
