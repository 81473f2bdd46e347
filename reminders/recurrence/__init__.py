"""Recurring timeout jobs: an RRULE (RFC 5545, parsed by ``python-dateutil``) or a 5-field cron
expression (``cronsim``, in UTC).

A recurring job's first occurrence fires at its ``action_time``; that time starts the series
(``series_start``: an RRULE's ``COUNT`` and ``UNTIL`` count from it; an RRULE counts in whole
seconds, so later occurrences fall on whole seconds). A series created with its start further in
the past than ``vetting.START_GRACE`` begins at its next occurrence from now: the past is not
replayed. Each later occurrence is the rule's next time after both the one that fired and the
moment it settled (a worker that was down for an hour fires the overdue occurrence once, then goes
on from now), created as a new pending job in the transaction that records the firing
(``handlers.timeout_jobs.settle_fired``).

A rule is a tenant's input that the worker evaluates, so it is held to three bounds, each in its
own module:

- ``rules``: on the rule, when a job is created (``rules.check``): one line, ``INTERVAL`` >= 1,
  occurrences never closer than ``RECURRENCE_MIN_INTERVAL_S`` (worked out from the rule's parts,
  not from a sample), and no day filters on a ``SECONDLY`` rule (dateutil walks such a rule second
  by second through every day its filters refuse). It also holds the evaluation itself
  (``rules.next_after``);
- ``vetting``: on its evaluation, when a job is created (``vetting.first_occurrence``): the rule's
  next occurrences, found in a child process, each within a fifth of ``RECURRENCE_BUDGET_MS``, or
  the rule is refused;
- ``budget``: on every evaluation (``budget.Calculator``): a child process that is killed once a
  query runs past ``RECURRENCE_BUDGET_MS``. A worker never evaluates a rule in its own process,
  and never inside a transaction: a rule that runs over its budget ends its series (the job is
  marked, an alert raised) and the worker goes on.

The cost of one evaluation does not grow with the series' age: a rule without ``COUNT`` is
evaluated from a start moved forward by whole periods of the rule to just before the moment asked
about (``rules._near``), which keeps every occurrence after it. A ``COUNT`` series is bounded by
its own length, which ``vetting.first_occurrence`` evaluates whole when the job is created.

This package imports nothing on its own, so that the child (``python -m
reminders.recurrence.budget``) loads only ``budget`` and ``rules``, and no Django.
"""
