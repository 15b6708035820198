"""Per-node seeds derived from the experiment seed, and from where a resumed run resumes.

Every node gets its own seed from (experiment seed, role, index) through NumPy's SeedSequence,
so actors never share an exploration stream, runs are reproducible, and adding an actor does
not change the seeds of the others.

A checkpoint holds the learner's state (its key included) and the counts, not the actors'
and evaluators' random state (their keys, their environments' generators) nor the sampling
position of a replay that is not saved with it. A resumed run gives those streams a fresh
start, drawn from the experiment seed and the resume point (`resumed_at`: the actor steps
saved with the checkpoint it resumes from, `magi_lp.runtime.nodes.resume_point`). Without
it every launch would replay the first launch's streams: the same environment episodes (a
reacher's targets, a cartpole's starts) and the same exploration noise, once per resume. A
new run (resume point 0) keeps the seeds it always had; two launches from the same
checkpoint draw the same streams.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np


def node_seed(
    experiment_seed: int, role: str, index: int = 0, environment: int = 0, resumed_at: int = 0
) -> int:
    """A 31-bit seed for node `index` of `role` ("learner", "actor", "evaluator", ...).

    `environment` numbers the environments of an actor that steps several
    (`envs_per_actor`); the first one keeps the node's seed, so a run with one environment
    per actor is seeded as before. `resumed_at` > 0 (the resume point) gives a resumed run's
    streams their fresh start: the SeedSequence's child `resumed_at`.
    """
    if resumed_at < 0:
        raise ValueError(f"resumed_at must be >= 0, got {resumed_at}")
    role_id = zlib.crc32(role.encode())
    entropy = [experiment_seed, role_id, index] + ([environment] if environment else [])
    spawn_key = (resumed_at,) if resumed_at else ()
    sequence = np.random.SeedSequence(entropy, spawn_key=spawn_key)
    return int(sequence.generate_state(1)[0] & 0x7FFFFFFF)


def node_key(experiment_seed: int, role: str, index: int = 0, resumed_at: int = 0) -> jax.Array:
    """A JAX PRNG key for node `index` of `role` (`resumed_at` as in `node_seed`)."""
    return jax.random.PRNGKey(node_seed(experiment_seed, role, index, resumed_at=resumed_at))
