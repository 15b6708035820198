"""magi_lp: Launchpad program graphs for Acme-style JAX agents, with per-node resources."""
