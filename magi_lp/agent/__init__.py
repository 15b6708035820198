"""What an agent project implements: the builder protocol, actor core, learner base
(data-parallel over a node's devices), device prefetch, variable client, device checks.

`docs/architecture.md` lists each module; docs/development.md's Layout shows this paragraph.
"""
