"""`projects/drq_v2/lp_main.py` with one change, for `make gpu-system` on a GPU machine whose EGL
renders only on a visible GPU (no Mesa software device).

lp_main's driver hides the GPUs from itself before it builds the program
(`CUDA_VISIBLE_DEVICES=''`, magi_lp/cli.py `_use_cpu_only_here`), and building the program
makes a throwaway environment to read its spec, which renders once: NVIDIA's EGL then lists no
device ("Cannot initialize a headless EGL display"). Here the environment spec is made once, by
the first experiment (the driver's planning, while it still sees the GPUs), and handed to every
later experiment of the process, so no later one renders; the program, its nodes and the engine
are lp_main's. benchmarks/gpu_system.py runs it only where a check shows that EGL cannot render
with the GPUs hidden (`--driver auto`).

    python benchmarks/gpu_system_lp_main.py --config benchmarks/gpu_system.py:gpu --launcher ray
"""

from magi_lp import distributed_main
from projects.drq_v2.config import validate_config

_SPECS: list = []


def make_experiment(config, workdir=None):
    from projects.drq_v2.experiment import make_experiment as make

    experiment = make(config, workdir=workdir)
    if not _SPECS:
        _SPECS.append(experiment.get_environment_spec())
    experiment.environment_spec = _SPECS[0]
    return experiment


if __name__ == "__main__":
    distributed_main(make_experiment, validate_config=validate_config)
