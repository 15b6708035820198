"""TD3 (Fujimoto et al. 2018) from proprioceptive states, on the magi_lp builder API: the
template for a new agent project.

A small second agent: it is what the toolkit's tests run end to end, and it shows the
files a new agent project needs and nothing more:

    config.py       every hyperparameter, named and commented (`get_agent_config`)
    networks.py     Haiku MLPs: deterministic tanh actor, twin critics
    learning.py     one jitted update, and `TD3Learner` (magi_lp's `JaxLearner`) around it
    acting.py       the behaviour (Gaussian noise) and evaluation (deterministic) policies
    builder.py      `TD3Builder` (magi_lp's `AgentBuilder`): replay, adder, dataset, learner,
                    policy
    environment.py  dm_control tasks as flat float32 vectors
    experiment.py   `make_experiment(config)`: builder + factories + config
    main.py         one process:  python projects/td3/main.py --config configs/td3_cartpole.py
    lp_main.py      distributed:  python projects/td3/lp_main.py --config configs/td3_cartpole.py

The experiment config lives at the repository root: configs/td3_cartpole.py.
"""
