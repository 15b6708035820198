"""Resource spec -> per-node env, GPU inventory, JAX build, placement plan (no JAX, TF,
Reverb, Acme or Launchpad: it plans on a machine that has none of them).

`docs/architecture.md` lists each module; docs/development.md's Layout shows this paragraph.
"""
