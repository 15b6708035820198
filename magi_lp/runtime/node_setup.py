"""Per-process settings that environment variables cannot make; run first in every node.

The placement plan gives each node its env (see `magi_lp.placement.resources.spec_to_env`). One
setting has no variable: keeping TensorFlow off the GPU. TF_FORCE_GPU_ALLOW_GROWTH only
makes TF grab memory gradually; a TF that sees a GPU still creates a CUDA context on it
(hundreds of MB) the first time it runs an op. `prepare_node_process` hides the GPUs from TF
when the plan says so (MAGI_LP_TF_GPU=0), which leaves them to JAX.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

_log = logging.getLogger(__name__)


def prepare_node_process() -> bool:
    """Applies the node's non-env settings; call it before anything imports JAX or TF.

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
