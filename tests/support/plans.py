"""Reading PostgreSQL's EXPLAIN (FORMAT JSON) plans in tests."""


def relations(plan) -> set[str]:
    """Every table a plan reads or writes (an UPDATE names its target, the parent table, which
    holds no rows itself)."""
    found = set()
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            found.add(plan["Relation Name"])
        for value in plan.values():
            found |= relations(value)
    elif isinstance(plan, list):
        for item in plan:
            found |= relations(item)
    return found


def scans(plan) -> set[tuple[str, str]]:
    """Every (node type, relation) pair of a plan's scans: how it reads each table (an UPDATE's
    target partitions are listed without a node of their own)."""
    found = set()
    if isinstance(plan, dict):
        if "Relation Name" in plan and "Node Type" in plan:
            found.add((plan["Node Type"], plan["Relation Name"]))
        for value in plan.values():
            found |= scans(value)
    elif isinstance(plan, list):
        for item in plan:
            found |= scans(item)
    return found
