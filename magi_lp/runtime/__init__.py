"""The run: experiment config, nodes, program graph, single-process runner, logs,
checkpoints.

`docs/architecture.md` lists each module; docs/development.md's Layout shows this paragraph.
"""
