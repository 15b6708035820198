"""Which hosts each node group's nodes run on: `config.hosts.place`, read and checked.

A group's value names one host ("main"), spreads the group evenly over several ("a1,a2"),
or gives each host its count ("a1:6,a2:10"); "" is the only host where there is just one.
`make_host_plan` (`magi_lp.cluster.host_plan`) plans each host's share against its GPUs.
Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from magi_lp.config_schema import fact_refusal, not_among, refusal
from magi_lp.errors import ConfigError
from magi_lp.placement.plan import GroupRequest


def place_nodes(
    requests: Mapping[str, GroupRequest], place: Mapping[str, str], hosts: Sequence[str]
) -> tuple[dict[str, dict[str, list[int]]], dict[str, int]]:
    """Host -> group -> the indices of that group's nodes there, and group -> over how many
    hosts it is spread, for every group with nodes (`place`: group -> its `hosts.place`)."""
    shares: dict[str, dict[str, list[int]]] = {h: {} for h in hosts}
    spread: dict[str, int] = {}
    for group, request in requests.items():
        if request.num_nodes == 0:
            continue
        start = 0
        parts = parse_place(group, place.get(group, ""), hosts, request.num_nodes)
        spread[group] = len(parts)
        for host, count in parts:
            shares[host][group] = list(range(start, start + count))
            start += count
    return shares, spread


def parse_place(
    group: str, text: str, hosts: Sequence[str], num_nodes: int
) -> list[tuple[str, int]]:
    """`hosts.place.<group>` -> [(host, node count)] in order; the counts sum to num_nodes.

    Forms: "" (the only host, when there is just one), "main", "a1,a2" (spread evenly, the
    first hosts taking one more when they do not divide), "a1:6,a2:10" (explicit counts, all
    or none).
    """
    where = f"hosts.place.{group}"
    if not isinstance(text, str):
        raise ConfigError(
            refusal(
                where, "a string such as 'main' or 'a1,a2'", text, "name the hosts of the group"
            )
        )
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        if len(hosts) > 1:
            raise ConfigError(
                fact_refusal(
                    f"{where} is empty",
                    f"there are {len(hosts)} hosts ({', '.join(hosts)})",
                    f"say which run group {group}, e.g. {where}='{hosts[0]}'",
                )
            )
        parts = [hosts[0]]
    names, counts = [], []
    for part in parts:
        name, _, count = part.partition(":")
        name = name.strip()
        if name not in hosts:
            what = f"{where}={text!r} names host {name!r}, which is not in hosts.machines"
            raise not_among(what, name, hosts, "the hosts")
        if name in names:
            raise ConfigError(
                fact_refusal(f"{where}={text!r} names host {name!r} twice", "", "name it once")
            )
        names.append(name)
        if count:
            if not count.strip().isdigit() or int(count) < 1:
                raise ConfigError(
                    refusal(
                        f"the node count of host {name} in {where}",
                        "an integer >= 1",
                        count.strip(),
                        f"e.g. {where}='{name}:2'",
                    )
                )
            counts.append(int(count))
    if counts and len(counts) != len(names):
        raise ConfigError(
            fact_refusal(
                f"{where}={text!r} gives node counts for some hosts",
                "they go with every host or with none",
                f"e.g. '{names[0]}:2,{names[-1]}:2'",
            )
        )
    if counts:
        if sum(counts) != num_nodes:
            raise ConfigError(
                fact_refusal(
                    f"{where}={text!r} places {sum(counts)} nodes",
                    f"group {group} has {num_nodes}",
                    f"make the counts sum to {num_nodes}",
                )
            )
        return list(zip(names, counts, strict=True))
    if len(names) > num_nodes:
        raise ConfigError(
            fact_refusal(
                f"{where}={text!r} spreads {num_nodes} node(s) over {len(names)} hosts",
                "a host named there runs at least one",
                f"name at most {num_nodes} host(s)",
            )
        )
    share, extra = divmod(num_nodes, len(names))
    return [(name, share + (1 if i < extra else 0)) for i, name in enumerate(names)]
