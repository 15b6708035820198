"""DrQ-v2 on reacher/easy from pixels: the paper's settings (medium, 3.1M frames).

python projects/drq_v2/main.py --config configs/reacher_easy.py
python projects/drq_v2/lp_main.py --config configs/reacher_easy.py:distributed
Built by projects/drq_v2/tasks.py; override any key with --config.<key>=value.
"""

from projects.drq_v2.tasks import task_config


def get_config(mode: str = ""):
    return task_config("reacher_easy", mode)
