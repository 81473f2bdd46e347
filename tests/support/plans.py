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
