"""DrQ-v2 on finger/spin from pixels: the paper's settings (easy, 1.1M frames).

python projects/drq_v2/main.py --config configs/finger_spin.py
python projects/drq_v2/lp_main.py --config configs/finger_spin.py:distributed
Built by projects/drq_v2/tasks.py; override any key with --config.<key>=value.
"""

from projects.drq_v2.tasks import task_config


def get_config(mode: str = ""):
    return task_config("finger_spin", mode)
