"""The run: experiment config, nodes, program graph, single-process runner, logs,
checkpoints.

`docs/architecture.md` lists each module; README's Layout shows this paragraph.
"""
