"""Reading PostgreSQL's EXPLAIN (FORMAT JSON) plans in tests."""

from collections.abc import Iterator


def _nodes(plan) -> Iterator[dict]:
    """Every object of a plan that names a relation, at any depth."""
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            yield plan
        for value in plan.values():
            yield from _nodes(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from _nodes(item)


def relations(plan) -> set[str]:
    """Every table a plan reads or writes (an UPDATE names its target, the parent table, which
    holds no rows itself)."""
    return {node["Relation Name"] for node in _nodes(plan)}


def scans(plan) -> set[tuple[str, str]]:
    """Every (node type, relation) pair of a plan's scans: how it reads each table (an UPDATE's
    target partitions are listed without a node of their own)."""
    return {(n["Node Type"], n["Relation Name"]) for n in _nodes(plan) if "Node Type" in n}
