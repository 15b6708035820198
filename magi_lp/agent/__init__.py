"""What an agent project implements: the builder protocol, replay schedule, actor core,
learner base (data-parallel over a node's devices), device prefetch, variable client, and the
frame replays (Reverb, and the device store).

`docs/architecture.md` lists each module; README's Layout shows this paragraph.
"""
