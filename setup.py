"""magi_lp: Launchpad program graphs for Acme-style JAX agents, with per-node resources."""

from setuptools import find_packages, setup

setup(
    name="magi_lp",
    version="0.1.0",
    description="Launchpad program-graph toolkit for Acme-style JAX agents.",
    python_requires="==3.10.*",
    packages=find_packages(include=["magi_lp", "magi_lp.*", "projects", "projects.*"]),
)
