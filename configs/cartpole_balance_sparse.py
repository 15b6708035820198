"""DrQ-v2 on cartpole/balance_sparse from pixels: the paper's settings (easy, 1.1M frames).

python projects/drq_v2/main.py --config configs/cartpole_balance_sparse.py
python projects/drq_v2/lp_main.py --config configs/cartpole_balance_sparse.py:distributed
Built by projects/drq_v2/tasks.py; override any key with --config.<key>=value.
"""

from projects.drq_v2.tasks import task_config


def get_config(mode: str = ""):
    return task_config("cartpole_balance_sparse", mode)
