"""DrQ-v2 on humanoid/run from pixels: the paper's settings (hard, 30.1M frames).

python projects/drq_v2/main.py --config configs/humanoid_run.py
python projects/drq_v2/lp_main.py --config configs/humanoid_run.py:distributed
Built by projects/drq_v2/tasks.py; override any key with --config.<key>=value.
"""

from projects.drq_v2.tasks import task_config


def get_config(mode: str = ""):
    return task_config("humanoid_run", mode)
