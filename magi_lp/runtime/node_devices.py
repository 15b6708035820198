"""Per-process settings that environment variables cannot make; run first in every node.

The placement plan gives each node its env (see `magi_lp.placement.resources.spec_to_env`). One
setting has no variable: keeping TensorFlow off the GPU. TF_FORCE_GPU_ALLOW_GROWTH only
makes TF grab memory gradually; a TF that sees a GPU still creates a CUDA context on it
(hundreds of MB) the first time it runs an op. `prepare_node_process` hides the GPUs from TF
when the plan says so (MAGI_LP_TF_GPU=0), which leaves them to JAX.

It then starts JAX's backend in a node whose JAX_PLATFORMS asks for CUDA, so that a node that
cannot use its GPU fails at once with the reason in words (`CudaBackendError`), not later
with jaxlib's "Unable to initialize backend 'cuda': " and no reason at all.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping

_log = logging.getLogger(__name__)


class CudaBackendError(RuntimeError):
    """A node placed on a GPU cannot start JAX's CUDA backend; the message says why."""


def prepare_node_process() -> bool:
    """Applies the node's non-env settings; call it before anything imports JAX or TF.

    Hides the GPUs from TensorFlow when told (see `hide_gpus_from_tensorflow`), then checks
    JAX's CUDA backend when the node's JAX_PLATFORMS asks for it (`check_jax_backend`).

    Returns:
      True when GPUs were hidden from TensorFlow.

    Raises:
      CudaBackendError: JAX_PLATFORMS names cuda and JAX cannot start it here.
    """
    hidden = hide_gpus_from_tensorflow()
    check_jax_backend()
    return hidden


def check_jax_backend(environ: Mapping[str, str] | None = None) -> str | None:
    """Starts JAX's backends now when JAX_PLATFORMS asks for CUDA; explains a failure.

    Costs nothing in CPU nodes (JAX is not imported). In a GPU node it initialises JAX,
    which the node does anyway moments later; TF has already been told to keep off the GPU.

    Returns:
      JAX's default backend ("gpu") when it was checked, None when the node wants no CUDA.

    Raises:
      CudaBackendError: with the reason in words (JAX's CUDA plugin not installed in this
        Python, the driver too old, CUDA_VISIBLE_DEVICES naming GPUs NVML does not list or
        none at all, no driver) and JAX's own message.
    """
    env = os.environ if environ is None else environ
    platforms = [p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if "cuda" not in platforms and "gpu" not in platforms:
        return None
    import jax  # only GPU nodes pay for this here, and they import JAX next anyway

    try:
        jax.devices()
        return jax.default_backend()
    except RuntimeError as err:
        # Imported here: NVML is only read to explain a failure.
        from magi_lp.placement.gpu_inventory import query_inventory
        from magi_lp.placement.jax_build import detect_jax_build, explain_cuda_failure

        why = explain_cuda_failure(detect_jax_build(), env, query_inventory())
        said = " ".join(str(err).split()) or type(err).__name__
        raise CudaBackendError(
            f"this node cannot start JAX on the GPU (JAX_PLATFORMS={env.get('JAX_PLATFORMS')}, "
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '<unset>')}): {why}. "
            f"JAX said: {said}"
        ) from err


def hide_gpus_from_tensorflow() -> bool:
    """Empties TensorFlow's GPU list when the plan says TF must not use the GPU.

    When MAGI_LP_TF_GPU is "0", TensorFlow is installed and the process can see a GPU,
    TF's GPU list is emptied (`tf.config.set_visible_devices([], "GPU")`).

    Why this imports TF itself instead of waiting: TF must be told before it first touches
    the GPU, and it touches it lazily on the first op, from whatever code imports it
    (Reverb, the dataset). Importing it here (about 2 s) is only done when the process
    sees a GPU, i.e. in GPU nodes, which import TF for their Reverb dataset anyway. CPU
    nodes get CUDA_VISIBLE_DEVICES="" from the plan, so TF cannot reach a GPU there, and
    they skip the import. If TF was already initialised (someone ran an op first), the
    call is refused by TF; that is logged and otherwise ignored, since the node still works,
    with TF holding some GPU memory it does not need.

    Returns:
      True when GPUs were hidden from TensorFlow.
    """
    if os.environ.get("MAGI_LP_TF_GPU") != "0":
        return False  # TF may use the GPU, or this process was not placed by a plan
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False  # no GPU visible to anything in this process; nothing to hide
    if "tensorflow" not in sys.modules and importlib.util.find_spec("tensorflow") is None:
        return False
    import tensorflow as tf  # only now: costly, and only needed in GPU nodes

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError as err:
        # "Visible devices cannot be modified after being initialized".
        _log.warning("TensorFlow already initialised; it keeps its GPU view: %s", err)
        return False
    return True
