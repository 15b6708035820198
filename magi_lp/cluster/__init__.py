"""Running one program on several hosts: `lp_main.py --launcher hosts|slurm|kubernetes`.

Everything multi-host lives here, on top of the single-host core (`magi_lp.placement`,
`magi_lp.launch`, `magi_lp.runtime`), which never imports it; the one way in is
`magi_lp.cli` (`--launcher`, and the `hosts` config check). By job:
- `config`: the `config.hosts` schema (machines, placement, engine settings);
- `host_plan`: which node runs on which host, GPU and port, checked before anything starts;
- `job`: the `ClusterJob` every renderer reads (nodes, addresses, env, stop settings);
- `engines`: one object per engine (hosts, slurm, kubernetes; Launchpad's, or Ray's where
  Launchpad is missing) with what differs between them;
- `host_scripts`, `slurm`, `kubernetes`: the generated per-host scripts, sbatch script and
  manifests (Launchpad);
- `ray_cluster`, `ray_slurm`, `kuberay`, `ray_node`: a Ray cluster inside a SLURM job (and
  what keeps each machine's Ray up and then ends it), and the KubeRay RayJob (the current
  stack);
- `prepare`: the Launchpad program pickled into a job folder the hosts share;
- `host_node`: what each generated command runs (`python -m magi_lp.cluster.host_node`);
- `stop_board`: the coordinator's stop board, which every node polls;
- `main`: the launcher (`--dry_run`, `--render`, or prepare and print the start command),
  and `python -m magi_lp.cluster --golden` for the tests' golden files.
"""
