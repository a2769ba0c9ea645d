#!/usr/bin/env python3
"""Checks `meshtrain topo --json` from a (fake) multi-node run: the node count and ranks per node, each
node's ranks on one host and hosts distinct between nodes, local ranks 0..n-1 on every node, and where
tensor-parallel groups sit: with --tp-in-node every tp group stays inside one node; with
--expect-tp-cross some tp group must span nodes (to show the check can see a bad layout).
Exit 0 when every check holds, 1 with one line per failed check otherwise.
SPDX-License-Identifier: MIT"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--ranks-per-node", type=int, required=True)
    ap.add_argument("--tp", type=int, required=True, help="expected tensor-parallel size")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--tp-in-node", action="store_true")
    where.add_argument("--expect-tp-cross", action="store_true")
    a = ap.parse_args()

    fails = []
    try:
        with open(a.file) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"FAIL: {a.file} is not meshtrain topo's JSON: {e}")
        return 1
    ranks = doc.get("ranks", [])
    world = a.nodes * a.ranks_per_node
    if doc.get("world") != world or len(ranks) != world:
        fails.append(f"world {doc.get('world')} with {len(ranks)} rank entries, expected {world}")
    if doc.get("nodes") != a.nodes:
        fails.append(f"{doc.get('nodes')} nodes, expected {a.nodes}")
    if doc.get("mesh", {}).get("tp") != a.tp:
        fails.append(f"mesh tp {doc.get('mesh', {}).get('tp')}, expected {a.tp}")

    node_of = {r["rank"]: r["node"] for r in ranks}
    hosts = {}
    for r in ranks:
        hosts.setdefault(r["node"], set()).add(r["host"])
    for node, hs in sorted(hosts.items()):
        if len(hs) != 1:
            fails.append(f"node {node} has ranks on several hosts {sorted(hs)}")
        local = sorted(r["local_rank"] for r in ranks if r["node"] == node)
        if local != list(range(a.ranks_per_node)):
            fails.append(f"node {node}: local ranks {local}, expected 0..{a.ranks_per_node - 1}")
    all_hosts = [next(iter(hs)) for hs in hosts.values() if len(hs) == 1]
    if len(set(all_hosts)) != len(all_hosts):
        fails.append(f"different nodes share a hostname: {all_hosts}")
    summary = doc.get("node_summary", [])
    if sorted(s.get("ranks") for s in summary) != [a.ranks_per_node] * a.nodes:
        fails.append(f"node_summary ranks {[s.get('ranks') for s in summary]}, expected {a.ranks_per_node} per node")

    tp_groups = doc.get("groups", {}).get("tp", [])
    if not tp_groups or any(len(g) != a.tp for g in tp_groups):
        fails.append(f"tp groups {tp_groups} are not groups of {a.tp}")
    crossing = [g for g in tp_groups if len({node_of.get(r) for r in g}) > 1]
    if a.tp_in_node and crossing:
        fails.append(f"tp groups span nodes: {crossing} (order {doc.get('mesh', {}).get('order')})")
    if a.expect_tp_cross and not crossing:
        fails.append(f"expected a tp group spanning nodes, got {tp_groups}")

    print(f"topo: {doc.get('nodes')} nodes {sorted(all_hosts)}, order {doc.get('mesh', {}).get('order')}, "
          f"tp groups {tp_groups}, {len(crossing)} crossing nodes")
    for f in fails:
        print(f"FAIL: {f}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
