"""Per-node seeds derived from the experiment seed.

Every node gets its own seed from (experiment seed, role, index) through NumPy's SeedSequence,
so actors never share an exploration stream, runs are reproducible, and adding an actor does
not change the seeds of the others.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np


def node_seed(experiment_seed: int, role: str, index: int = 0, environment: int = 0) -> int:
    """A 31-bit seed for node `index` of `role` ("learner", "actor", "evaluator", ...).

    `environment` numbers the environments of an actor that steps several
    (`envs_per_actor`); the first one keeps the node's seed, so a run with one environment
    per actor is seeded as before.
    """
    role_id = zlib.crc32(role.encode())
    entropy = [experiment_seed, role_id, index] + ([environment] if environment else [])
    sequence = np.random.SeedSequence(entropy)
    return int(sequence.generate_state(1)[0] & 0x7FFFFFFF)


def node_key(experiment_seed: int, role: str, index: int = 0) -> jax.Array:
    """A JAX PRNG key for node `index` of `role`."""
    return jax.random.PRNGKey(node_seed(experiment_seed, role, index))
