"""Admin helpers for tables of tens of millions of rows: a paginator and an exact-id search.

The paginator:

Django's changelist counts the (filtered) queryset for its paginator on every page; a
``COUNT(*)`` over 50 million rows takes seconds. Unfiltered, PostgreSQL's planner estimate
(``pg_class.reltuples``, kept fresh by autovacuum; summed over the partitions of a partitioned
table) is used instead; filtered, the count stops at
``COUNT_CAP`` (a LIMITed subquery), which is plenty to page through.

The exact-id search: a term that can be an id is looked up by index on each searched column; a
term that cannot be one finds nothing, never a text scan.
"""

from __future__ import annotations

import functools
import operator

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

COUNT_CAP = 100_000
ESTIMATE_ABOVE = 100_000  # below this a real count is cheap


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not hasattr(qs, "query"):
            return len(qs)
        estimate = _estimate(qs) if not qs.query.where else None
        if estimate is not None and estimate > ESTIMATE_ABOVE:
            return estimate
        return qs.order_by()[:COUNT_CAP].count()


def _estimate(qs) -> int | None:
    connection = connections[qs.db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        # The leaves' estimates: a partitioned table keeps none of its own (docs/partitioning.md);
        # a plain table is its own only leaf.
        cursor.execute(
            "SELECT sum(c.reltuples)::bigint FROM pg_partition_tree(%s::regclass) t "
            "JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf AND c.reltuples > 0",
            [qs.model._meta.db_table],
        )
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] and row[0] > 0 else None


def exact_id(term: str) -> int | None:
    """An id typed in a search box, if it can be one (digits, fits a BIGINT): a search that uses
    an index, never a text scan."""
    term = term.strip()
    return int(term) if term.isdigit() and len(term) <= 18 else None


class ExactIdSearch:
    """ModelAdmin mixin: the search box takes one id and finds the rows where any of
    ``search_fields`` (each ``"=<field>"``) equals it."""

    search_fields: list[str]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        if not search_term.strip():
            return queryset, False
        if (pk := exact_id(search_term)) is None:
            return queryset.none(), False
        matches = (Q(**{name.removeprefix("="): pk}) for name in self.search_fields)
        return queryset.filter(functools.reduce(operator.or_, matches)), False
