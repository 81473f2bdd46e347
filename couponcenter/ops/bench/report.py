"""``bench_all``'s report: one run's results (``suite.run``) read as a table of figures, each
beside its raw limit from the same run, and as the ratios docs/performance.md sets its targets in.

Machines of the same kind differ 2-3x from run to run, so a figure alone says little: the targets
are ratios of one run (``RATIO_TARGETS``), and the few absolute ones sit beside them
(``at_a_glance``). ``markdown`` prints one run's table, ``markdown_spread`` one table over several
runs (``bench_all --report``). Everything here reads a result dict and nothing else, so the report
of an earlier run's JSON is the same as the run's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reminders.bench.fanout import OF_BULLMQ_TARGET, OF_WRK_TARGET


@dataclass
class Figure:
    """One row of the table: a figure beside its raw limit, the ratio and the target."""

    name: str
    value: float | None
    unit: str
    raw_name: str = ""
    raw_value: float | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None


def _ratio(value: float | None, raw: float | None) -> float | None:
    return round(value / raw, 3) if value and raw else None


def figures(result: dict[str, Any]) -> list[Figure]:
    """The table's rows from one run's results."""
    r, rows = result.get("reminders", {}), []
    n = f"{r['count'] // 1000}k" if r.get("count") else ""
    if r:
        dispatch = r.get("dispatch_per_s")
        ratio = _ratio(dispatch, r.get("raw_limit_per_s"))
        rows.append(
            Figure(
                f"reminders: {n} burst claimed and handed on",
                dispatch,
                "/s",
                "bare Lua pop-and-ack loop",
                r.get("raw_limit_per_s"),
                ratio,
                ">= 0.30 of raw",
                ratio is not None and ratio >= 0.30,
            )
        )
        e2e = round(r["count"] / r["end_to_end_s"]) if r.get("end_to_end_s") else None
        raw_inbox = result.get("raw_inbox", {}).get("raw_inbox_per_s")
        ratio = _ratio(e2e, raw_inbox)
        rows.append(
            Figure(
                f"reminders: {n} burst in the inbox (no pre-staging)",
                e2e,
                "/s",
                "bare SQL inbox-write loop",
                raw_inbox,
                ratio,
                ">= 0.60 of raw",
                ratio is not None and ratio >= 0.60,
            )
        )
        p99, without = r.get("burst_p99_ms"), r.get("burst_p99_ms_without_prestage")
        rows.append(
            Figure(
                f"reminders: {n} burst, p99 lateness to the inbox, pre-staged",
                p99,
                "ms",
                "the same burst without pre-staging",
                without,
                _ratio(p99, without),
                "<= 1000 ms",
                p99 is not None and p99 <= 1000,
            )
        )
        for suffix, label in (("", "pre-staged"), ("_without_prestage", "no pre-staging")):
            p99 = r.get(f"steady_lateness_p99_ms{suffix}")
            p999 = r.get(f"steady_lateness_p999_ms{suffix}")
            rate = r.get(f"steady_rate_per_s{suffix}")
            if p99 is None:
                continue
            rows.append(
                Figure(
                    f"reminders: steady {rate}/s, p99 / p99.9 lateness ({label})",
                    p99,
                    "ms",
                    "p99.9",
                    p999,
                    None,
                    "p99 <= 100, p99.9 <= 250 ms",
                    p99 <= 100 and (p999 or 0) <= 250,
                )
            )
    e = result.get("expiry", {})
    if e:
        rows.append(
            Figure(
                f"expiry: {e['count']:,} coupons, {e['workers']} sweepers",
                e.get("per_s"),
                "/s",
                "bare SQL expiry loop",
                e.get("raw_sql_per_s"),
                e.get("of_raw"),
                ">= 0.90 of raw",
                (e.get("of_raw") or 0) >= 0.90,
            )
        )
    c = result.get("claims", {})
    if c:
        ratio = _ratio(c.get("claims_per_s"), c.get("raw_limit_per_s"))
        rows.append(
            Figure(
                "claims over HTTP",
                c.get("claims_per_s"),
                "/s",
                "the same gunicorn on /healthz/live/",
                c.get("raw_limit_per_s"),
                ratio,
                ">= 0.25 of raw",
                ratio is not None and ratio >= 0.25,
            )
        )
    rows += _rush_figures(result.get("rush", {}))
    b = result.get("backlog", {})
    if b:
        small, large = b["sizes"][0], b["sizes"][-1]
        rows.append(
            Figure(
                f"backlog: claim + settle in parcels (reminders) with {large['pending']:,} pending",
                large["claim_ack_per_s"],
                "/s",
                f"the same with {small['pending']:,} pending",
                small["claim_ack_per_s"],
                b["claim_rate_growth"],
                ">= 0.85 of the smaller backlog",
                b["claim_rate_growth"] >= 0.85,
            )
        )
        if "claim_ack_per_s_per_entry" in large:
            rows.append(
                Figure(
                    f"backlog: claim + ack entry by entry (timeout topics) with "
                    f"{large['pending']:,} pending",
                    large["claim_ack_per_s_per_entry"],
                    "/s",
                    f"the same with {small['pending']:,} pending",
                    small["claim_ack_per_s_per_entry"],
                    b["claim_rate_growth_per_entry"],
                )
            )
        rows.append(
            Figure(
                "backlog: Redis memory per pending reminder",
                b["max_bytes_per_pending"],
                "bytes",
                f"at {small['pending']:,} pending",
                small["bytes_per_pending"],
                b["memory_growth"],
                "<= 120 bytes",
                b["max_bytes_per_pending"] <= 120,
            )
        )
        if b.get("rebuild"):
            r_small, r_large = b["rebuild"][0], b["rebuild"][-1]
            rows.append(
                Figure(
                    f"backlog: rebuild from PostgreSQL, {r_large['scheduled']:,} scheduled",
                    r_large["rebuild_per_s"],
                    "/s",
                    f"the same with {r_small['scheduled']:,}",
                    r_small["rebuild_per_s"],
                    b["rebuild_rate_growth"],
                    "",
                    None,
                )
            )
    t = result.get("timeouts", {})
    if t:
        ratio = t.get("burst_ratio_to_raw")
        rows.append(
            Figure(
                f"timeouts: {t['burst_count']:,} http jobs due in one second",
                t.get("burst_delivered_per_s"),
                "/s",
                "a plain keep-alive client on the same receiver",
                t.get("raw_receiver_per_s"),
                ratio,
                ">= 0.50 of raw",
                ratio is not None and ratio >= 0.50,
            )
        )
        p99 = t.get("isolation_lateness_p99_ms")
        rows.append(
            Figure(
                f"timeouts: fast topic at {t['isolation_steady_rate']}/s, p99 "
                "lateness while a slow topic is saturated",
                p99,
                "ms",
                "p99.9",
                t.get("isolation_lateness_p999_ms"),
                None,
                "p99 <= 100 ms",
                p99 is not None and p99 <= 100,
            )
        )
        bulk = t.get("bulk_create_jobs_per_s")
        rows.append(
            Figure(
                "timeouts: bulk create through the API (10,000 per request)",
                bulk,
                "jobs/s",
                target=">= 20,000/s",
                met=bulk is not None and bulk >= 20_000,
            )
        )
        rows.append(
            Figure(
                "timeouts: cancel by business key through the API",
                t.get("cancel_by_key_per_s"),
                "requests/s",
            )
        )
    rows += _days_figures(result.get("days", {}))
    rows += _fanout_figures(result.get("fanout", {}))
    p = result.get("peers", {})
    if p and r:
        ours = round(r["count"] / r["end_to_end_s"]) if r.get("end_to_end_s") else None
        for peer, label in (("bullmq", "BullMQ delayed jobs"), ("celery_eta", "Celery ETA")):
            if f"{peer}_burst_per_s" not in p:
                continue
            rows.append(
                Figure(
                    f"peer {label}: {n} burst drained (no-op job)",
                    p.get(f"{peer}_burst_per_s"),
                    "/s",
                    "ours, into the inbox",
                    ours,
                    _ratio(ours, p.get(f"{peer}_burst_per_s")),
                )
            )
            without = r.get("burst_p99_ms_without_prestage")
            rows.append(
                Figure(
                    f"peer {label}: {n} burst, p99 lateness",
                    p.get(f"{peer}_burst_lateness_p99_ms"),
                    "ms",
                    "ours, pre-staged",
                    r.get("burst_p99_ms"),
                    None,
                    f"ours without pre-staging: {without} ms",
                )
            )
            for rate in p.get("peer_rates", []):
                key = f"{peer}_steady_{rate}_lateness"
                rows.append(
                    Figure(
                        f"peer {label}: steady {rate}/s, p99 / p99.9 lateness",
                        p.get(f"{key}_p99_ms"),
                        "ms",
                        "p99.9",
                        p.get(f"{key}_p999_ms"),
                    )
                )
    return rows


def _days_figures(days: dict[str, Any]) -> list[Figure]:
    """``bench_days``: each rate on the last day beside the first's; the size beside the first
    day at full retention."""
    if not days.get("days"):
        return []
    first, last = days["days"][0], days["days"][-1]
    n = len(days["days"])
    rows = [
        Figure(
            f"days: {rate.replace('_', ' ')} on day {n}",
            last[f"{rate}_per_s"],
            "/s",
            "day 1",
            first[f"{rate}_per_s"],
            ratio,
            f">= {DAYS_RATE_KEEPS} of day 1",
            ratio is not None and ratio >= DAYS_RATE_KEEPS,
        )
        for rate, ratio in days["day_last_of_first"].items()
    ]
    # The same rates, each over the machine's own speed on its day (``machine_reference``).
    of_reference = days.get("day_last_of_first_of_reference") or {}
    rows += [
        Figure(
            f"days: {rate.replace('_', ' ')} on day {n}, over the machine's speed that day",
            round(last[f"{rate}_per_s"] / last["reference_per_s"], 4),
            "of the reference",
            "day 1",
            round(first[f"{rate}_per_s"] / first["reference_per_s"], 4),
            ratio,
            f">= {DAYS_RATE_KEEPS} of day 1",
            ratio is not None and ratio >= DAYS_RATE_KEEPS,
        )
        for rate, ratio in of_reference.items()
    ]
    grows = days.get("table_bytes_last_of_steady")
    rows.append(
        Figure(
            f"days: tables and indexes on day {n}",
            round(days["table_bytes_last"] / 2**20, 1),
            "MiB",
            f"day {days['steady_day']}, the first at full retention",
            round(days["table_bytes_steady"] / 2**20, 1),
            grows,
            f"<= {DAYS_SIZE_GROWS} of that day",
            grows is not None and grows <= DAYS_SIZE_GROWS,
        )
    )
    return rows


def _fanout_figures(f: dict[str, Any]) -> list[Figure]:
    if not f.get("ours_per_s"):
        return []
    n, c = f"{f['fanout_count']:,}", f["fanout_concurrency"]
    of_wrk, of_bullmq = f.get("fanout_of_wrk"), f.get("fanout_of_bullmq")
    rows = [
        Figure(
            f"fan-out: {n} webhooks to nginx (204), {c} connections",
            f["ours_per_s"],
            "/s",
            "wrk on the same nginx and connections",
            f.get("wrk_per_s"),
            of_wrk,
            f">= {OF_WRK_TARGET:.2f} of wrk",
            of_wrk is not None and of_wrk >= OF_WRK_TARGET,
        )
    ]
    if f.get("bullmq_per_s"):
        rows.append(
            Figure(
                f"fan-out: a BullMQ worker (fetch) posting the same {n} webhooks",
                f["bullmq_per_s"],
                "/s",
                "ours",
                f["ours_per_s"],
                of_bullmq,
                f"ours > {OF_BULLMQ_TARGET:.1f}x BullMQ",
                of_bullmq is not None and of_bullmq > OF_BULLMQ_TARGET,
            )
        )
    rows.append(
        Figure(
            "fan-out: worker CPU seconds per 1,000 webhooks, ours",
            f.get("ours_cpu_s_per_1k"),
            "s",
            "BullMQ's",
            f.get("bullmq_cpu_s_per_1k"),
            _ratio(f.get("ours_cpu_s_per_1k"), f.get("bullmq_cpu_s_per_1k")),
        )
    )
    return rows


def _rush_runs(rush: dict[str, Any]) -> tuple[dict, dict] | tuple[()]:
    """The rush of mostly refusals (the smallest stock) and of mostly winners (the largest)."""
    runs = sorted(rush.get("runs", []), key=lambda run: run["stock"])
    return (runs[0], runs[-1]) if runs else ()


def _rush_figures(rush: dict[str, Any]) -> list[Figure]:
    rows: list[Figure] = []
    if not _rush_runs(rush):
        return rows
    users = f"{rush['users']:,} users"
    for run, least in zip(
        _rush_runs(rush), (RUSH_REFUSALS_OF_RAW, RUSH_WINNERS_OF_RAW), strict=True
    ):
        name = f"rush: {users}, stock {run['stock']:,}"
        ratio = run["answers_of_healthz"]
        rows.append(
            Figure(
                f"{name}: every claimer answered",
                run["answers_per_s"],
                "/s",
                "the same gunicorn and wrk on /healthz/live/",
                run["healthz_per_s"],
                ratio,
                f">= {least:.2f} of raw",
                ratio is not None and ratio >= least,
            )
        )
        rows.append(
            Figure(
                f"{name}: p99 / p99.9 answer latency",
                run["p99_ms"],
                "ms",
                "p99.9",
                run["p999_ms"],
                None,
                "p99 <= 250 ms",
                run["p99_ms"] <= 250,
            )
        )
        rows.append(Figure(f"{name}: time until every claimer had an answer",
                           run["all_answered_s"], "s"))  # fmt: skip
        rows.append(
            Figure(
                f"{name}: winners (users over their limit: must be 0)",
                run["winners"],
                "users",
                "users over their limit",
                run["users_over_limit"],
                None,
                "= the stock, 0 over the limit",
                run["exact"],
            )
        )
    return rows


# docs/performance.md: the targets as ratios of one run (key -> the minimum).
RATIO_TARGETS = {
    "reminders_end_to_end_of_raw_inbox": 0.6,
    "reminders_dispatch_of_raw_lua": 0.3,
    "expiry_of_raw_sql": 0.9,
    "claims_of_raw_http": 0.25,
    "claim_rate_10m_of_1m": 0.85,
    "timeouts_http_of_raw_receiver": 0.5,
    "rush_answers_of_raw_http": 0.7,
    "rush_winners_of_raw_http": 0.5,
    "fanout_of_wrk": OF_WRK_TARGET,
    "fanout_of_bullmq": OF_BULLMQ_TARGET,  # ahead of it: strictly above
}
# bench_days (issue 28): every rate on the last day at least this share of the first day's; the
# tables' size on the last day at most this multiple of the first day at full retention.
DAYS_RATE_KEEPS = 0.9
DAYS_SIZE_GROWS = 1.1
RUSH_REFUSALS_OF_RAW = RATIO_TARGETS["rush_answers_of_raw_http"]
RUSH_WINNERS_OF_RAW = RATIO_TARGETS["rush_winners_of_raw_http"]


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    """docs/performance.md's keys: each target as a ratio measured in this run (None: that part
    did not run), and beside them the figures whose targets are absolute."""
    r, e, c = result.get("reminders", {}), result.get("expiry", {}), result.get("claims", {})
    b, t = result.get("backlog", {}), result.get("timeouts", {})
    e2e = round(r["count"] / r["end_to_end_s"]) if r.get("end_to_end_s") else None
    out: dict[str, Any] = {
        "reminders_end_to_end_of_raw_inbox": _ratio(
            e2e, result.get("raw_inbox", {}).get("raw_inbox_per_s")
        ),
        "reminders_dispatch_of_raw_lua": _ratio(r.get("dispatch_per_s"), r.get("raw_limit_per_s")),
        "expiry_of_raw_sql": e.get("of_raw"),
        "claims_of_raw_http": _ratio(c.get("claims_per_s"), c.get("raw_limit_per_s")),
        "claim_rate_10m_of_1m": b.get("claim_rate_growth"),
        "timeouts_http_of_raw_receiver": t.get("burst_ratio_to_raw"),
    }
    refusals, winners = _rush_runs(result.get("rush", {})) or ({}, {})
    out["rush_answers_of_raw_http"] = refusals.get("answers_of_healthz")
    out["rush_winners_of_raw_http"] = winners.get("answers_of_healthz")
    # bench_days: per rate, its last day over its first; the size's last day over its steady one.
    days = result.get("days", {})
    out["day_last_of_first"] = days.get("day_last_of_first")
    out["day_last_of_first_of_reference"] = days.get("day_last_of_first_of_reference")
    out["table_bytes_last_of_steady"] = days.get("table_bytes_last_of_steady")
    out["fanout_of_wrk"] = result.get("fanout", {}).get("fanout_of_wrk")
    out["fanout_of_bullmq"] = result.get("fanout", {}).get("fanout_of_bullmq")
    # bench_day: each path in the day over the same path alone (``day.ratios``).
    out.update(result.get("day", {}).get("ratios", {}))
    return out


def at_a_glance(result: dict[str, Any]) -> dict[str, Any]:
    """The figures docs/performance.md sets absolute targets for, beside the ratios."""
    r, b, t = result.get("reminders", {}), result.get("backlog", {}), result.get("timeouts", {})
    rush = _rush_runs(result.get("rush", {}))
    return {
        "burst_p99_ms": r.get("burst_p99_ms"),
        "burst_p99_ms_without_prestage": r.get("burst_p99_ms_without_prestage"),
        "steady_5k_p99_ms": r.get("steady_lateness_p99_ms"),
        "steady_5k_p999_ms": r.get("steady_lateness_p999_ms"),
        "steady_5k_p99_ms_without_prestage": r.get("steady_lateness_p99_ms_without_prestage"),
        "steady_5k_p999_ms_without_prestage": r.get("steady_lateness_p999_ms_without_prestage"),
        "bytes_per_pending_job": b.get("max_bytes_per_pending"),
        "timeouts_bulk_create_per_s": t.get("bulk_create_jobs_per_s"),
        "fast_topic_p99_ms_beside_slow_topic": t.get("isolation_lateness_p99_ms"),
        "rush_p99_ms": max((run["p99_ms"] for run in rush), default=None),
        "rush_exact": all(run["exact"] for run in rush) if rush else None,
        "fanout_cpu_s_per_1k": result.get("fanout", {}).get("fanout_cpu_s_per_1k"),
        "fanout_bullmq_cpu_s_per_1k": result.get("fanout", {}).get("fanout_bullmq_cpu_s_per_1k"),
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"Run {result['started_at']}, {result['seconds']:.0f} s: {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']} GiB, {m['database']}, Redis {m['redis']}; load average "
        f"{' / '.join(map(str, m['load_average']))} at the start, "
        f"{' / '.join(map(str, result['load_average_end']))} at the end.",
        "",
        "| figure | measured | raw limit or comparison (same run) | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["figures"]:
        value = "—" if row["value"] is None else f"{row['value']:,} {row['unit']}"
        raw = (
            ""
            if not row["raw_name"]
            else f"{row['raw_name']}: "
            + ("—" if row["raw_value"] is None else f"{row['raw_value']:,}")
        )
        met = "" if row["met"] is None else ("yes" if row["met"] else "**no**")
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.3f}"
        lines.append(f"| {row['name']} | {value} | {raw} | {ratio} | {row['target']} | {met} |")
    if "bullmq_skipped" in result.get("peers", {}):
        lines += ["", f"BullMQ skipped: {result['peers']['bullmq_skipped']}."]
    return "\n".join(lines) + "\n"


def _spread(values: list, unit: str = "") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    values = sorted(values)
    mid = values[len(values) // 2]
    fmt = (lambda v: f"{v:,.3f}") if unit == "ratio" else (lambda v: f"{v:,}")
    text = fmt(mid)
    if len(values) > 1 and values[0] != values[-1]:
        text += f" ({fmt(values[0])}–{fmt(values[-1])})"
    return text + (f" {unit}" if unit and unit != "ratio" else "")


def markdown_spread(results: list[dict[str, Any]]) -> str:
    """One table over several runs: the median of each figure with the range of the runs."""
    lines = [f"{len(results)} runs of `bench_all`:", ""]
    for result in results:
        m = result["machine"]
        lines.append(
            f"- {result['started_at']}: {m['cpu']}, {m['cores']} cores; load average "
            f"{m['load_average'][0]} at the start, {result['load_average_end'][0]} at the end"
        )
    lines += [
        "",
        "| figure | measured, median (range) | raw limit or comparison, median (range) | ratio "
        "| target | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows: dict[str, list[dict]] = {}
    for result in results:
        for row in result["figures"]:
            rows.setdefault(row["name"], []).append(row)
    for name, runs in rows.items():
        first = runs[0]
        value = _spread([r["value"] for r in runs], first["unit"])
        raw = (
            ""
            if not first["raw_name"]
            else f"{first['raw_name']}: " + _spread([r["raw_value"] for r in runs])
        )
        ratio = _spread([r["ratio"] for r in runs], "ratio") if first["ratio"] is not None else ""
        verdicts = [r["met"] for r in runs if r["met"] is not None]
        met = "" if not verdicts else f"{sum(verdicts)} of {len(verdicts)}"
        lines.append(f"| {name} | {value} | {raw} | {ratio} | {first['target']} | {met} |")
    return "\n".join(lines) + "\n"
