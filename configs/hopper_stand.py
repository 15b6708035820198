"""DrQ-v2 on hopper/stand from pixels: the paper's settings (easy, 1.1M frames).

python projects/drq_v2/main.py --config configs/hopper_stand.py
python projects/drq_v2/lp_main.py --config configs/hopper_stand.py:distributed
Built by projects/drq_v2/tasks.py; override any key with --config.<key>=value.
"""

from projects.drq_v2.tasks import task_config


def get_config(mode: str = ""):
    return task_config("hopper_stand", mode)
