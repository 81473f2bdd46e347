"""bench_all's JSON: docs/performance.md's ratios and figures, computed from one run's parts."""

from __future__ import annotations

from couponcenter.ops.bench import report

RUN = {
    "reminders": {"count": 200_000, "end_to_end_s": 8.0, "dispatch_per_s": 600_000,
                  "raw_limit_per_s": 1_500_000, "burst_p99_ms": 0.0,
                  "burst_p99_ms_without_prestage": 6500.0, "steady_lateness_p99_ms": 3.0,
                  "steady_lateness_p999_ms": 9.0, "steady_lateness_p99_ms_without_prestage": 40.0,
                  "steady_lateness_p999_ms_without_prestage": 90.0, "steady_rate_per_s": 5000},
    "raw_inbox": {"raw_inbox_per_s": 40_000},
    "expiry": {"count": 1_000_000, "workers": 2, "per_s": 90_000, "raw_sql_per_s": 100_000,
               "of_raw": 0.9},
    "claims": {"claims_per_s": 1000, "raw_limit_per_s": 3000},
    "backlog": {"sizes": [{"pending": 10**6, "bytes_per_pending": 101.7, "claim_ack_per_s": 9,
                           "claim_ack_per_s_per_entry": 5},
                          {"pending": 10**7, "bytes_per_pending": 113.5, "claim_ack_per_s": 8,
                           "claim_ack_per_s_per_entry": 4}],
                "claim_rate_growth": 0.889, "claim_rate_growth_per_entry": 0.8,
                "memory_growth": 1.116, "max_bytes_per_pending": 113.5},
    "timeouts": {"burst_count": 200_000, "burst_delivered_per_s": 800, "raw_receiver_per_s": 1000,
                 "burst_ratio_to_raw": 0.8, "isolation_steady_rate": 200,
                 "isolation_lateness_p99_ms": 45.0, "isolation_lateness_p999_ms": 60.0,
                 "bulk_create_jobs_per_s": 50_000, "cancel_by_key_per_s": 300},
    "fanout": {"fanout_count": 20_000, "fanout_concurrency": 16, "wrk_per_s": 40_000,
               "ours_per_s": 8_000, "bullmq_per_s": 5_000, "fanout_of_wrk": 0.2,
               "fanout_of_bullmq": 1.6, "ours_cpu_s_per_1k": 0.25, "bullmq_cpu_s_per_1k": 0.4,
               "fanout_cpu_s_per_1k": 0.25, "fanout_bullmq_cpu_s_per_1k": 0.4},
    "rush": {"users": 20_000, "runs": [
        {"stock": 20_000, "answers_per_s": 900.0, "healthz_per_s": 3000.0,
         "answers_of_healthz": 0.3, "p99_ms": 120.0, "p999_ms": 300.0, "all_answered_s": 23.2,
         "winners": 20_000, "users_over_limit": 0, "exact": True},
        {"stock": 1_000, "answers_per_s": 2400.0, "healthz_per_s": 3000.0,
         "answers_of_healthz": 0.8, "p99_ms": 280.0, "p999_ms": 400.0, "all_answered_s": 9.3,
         "winners": 1_000, "users_over_limit": 0, "exact": True},
    ]},
}  # fmt: skip


def test_every_performance_target_reads_as_a_ratio_of_the_run():
    ratios = report.ratios(RUN)
    assert ratios == {
        "reminders_end_to_end_of_raw_inbox": 0.625,  # 25,000/s of 40,000/s
        "reminders_dispatch_of_raw_lua": 0.4,
        "expiry_of_raw_sql": 0.9,
        "claims_of_raw_http": 0.333,
        "claim_rate_10m_of_1m": 0.889,
        "timeouts_http_of_raw_receiver": 0.8,
        "rush_answers_of_raw_http": 0.8,  # the smallest stock: mostly refusals
        "rush_winners_of_raw_http": 0.3,  # the largest: a unit for every user
        "fanout_of_wrk": 0.2,
        "fanout_of_bullmq": 1.6,
        "day_last_of_first": None,  # bench_days did not run
        "day_last_of_first_of_reference": None,
        "table_bytes_last_of_steady": None,
    }
    assert set(ratios) == set(report.RATIO_TARGETS) | {
        "day_last_of_first",
        "day_last_of_first_of_reference",
        "table_bytes_last_of_steady",
    }


def test_the_absolute_targets_sit_beside_the_ratios():
    glance = report.at_a_glance(RUN)
    assert (glance["burst_p99_ms"], glance["steady_5k_p99_ms"], glance["steady_5k_p999_ms"]) == (
        0.0, 3.0, 9.0
    )  # fmt: skip
    assert glance["bytes_per_pending_job"] == 113.5
    assert glance["timeouts_bulk_create_per_s"] == 50_000
    assert glance["fast_topic_p99_ms_beside_slow_topic"] == 45.0
    assert (glance["rush_p99_ms"], glance["rush_exact"]) == (280.0, True)  # the worse rush
    assert (glance["fanout_cpu_s_per_1k"], glance["fanout_bullmq_cpu_s_per_1k"]) == (0.25, 0.4)


def test_the_fan_out_rows_judge_ours_against_wrk_and_bullmq():
    rows = {row.name: row for row in report.figures(RUN)}
    wrk = rows["fan-out: 20,000 webhooks to nginx (204), 16 connections"]
    assert (wrk.value, wrk.raw_value, wrk.ratio, wrk.met) == (8_000, 40_000, 0.2, True)
    bullmq = rows["fan-out: a BullMQ worker (fetch) posting the same 20,000 webhooks"]
    assert (bullmq.value, bullmq.raw_value, bullmq.ratio, bullmq.met) == (5_000, 8_000, 1.6, True)
    cpu = rows["fan-out: worker CPU seconds per 1,000 webhooks, ours"]
    assert (cpu.value, cpu.raw_value, cpu.ratio) == (0.25, 0.4, 0.625)
    behind = {**RUN, "fanout": {**RUN["fanout"], "fanout_of_wrk": 0.1, "fanout_of_bullmq": 1.0}}
    rows = {row.name: row for row in report.figures(behind)}
    assert rows["fan-out: 20,000 webhooks to nginx (204), 16 connections"].met is False
    assert rows["fan-out: a BullMQ worker (fetch) posting the same 20,000 webhooks"].met is False


def test_a_part_that_did_not_run_has_no_ratio():
    ratios = report.ratios({"expiry": RUN["expiry"]})
    assert ratios["expiry_of_raw_sql"] == 0.9
    assert ratios["reminders_dispatch_of_raw_lua"] is None
    assert ratios["claim_rate_10m_of_1m"] is None
    assert ratios["rush_answers_of_raw_http"] is ratios["rush_winners_of_raw_http"] is None


def test_the_table_has_both_backlog_claim_paths():
    names = [row.name for row in report.figures(RUN)]
    assert any("claim + settle in parcels" in name for name in names)
    assert any("claim + ack entry by entry" in name for name in names)


def test_the_rush_rows_judge_each_stock_against_its_own_target():
    rows = {row.name: row for row in report.figures(RUN)}
    refusals = rows["rush: 20,000 users, stock 1,000: every claimer answered"]
    winners = rows["rush: 20,000 users, stock 20,000: every claimer answered"]
    assert (refusals.ratio, refusals.target, refusals.met) == (0.8, ">= 0.70 of raw", True)
    assert (winners.ratio, winners.target, winners.met) == (0.3, ">= 0.50 of raw", False)
    assert rows["rush: 20,000 users, stock 1,000: p99 / p99.9 answer latency"].met is False
    assert rows["rush: 20,000 users, stock 20,000: p99 / p99.9 answer latency"].met is True


DAYS = {
    "days": [
        {"day": 1, "expiry_sweep_per_s": 1000, "inbox_burst_per_s": 2000,
         "timeout_create_per_s": 3000, "timeout_fire_per_s": 400, "reference_per_s": 100_000},
        {"day": 2, "expiry_sweep_per_s": 950, "inbox_burst_per_s": 1000,
         "timeout_create_per_s": 3000, "timeout_fire_per_s": 400, "reference_per_s": 50_000},
    ],
    "day_last_of_first": {"expiry_sweep": 0.95, "inbox_burst": 0.5, "timeout_create": 1.0,
                          "timeout_fire": 1.0},
    # The machine at half its day 1 speed on day 2.
    "day_last_of_first_of_reference": {"expiry_sweep": 1.9, "inbox_burst": 1.0,
                                       "timeout_create": 2.0, "timeout_fire": 2.0},
    "steady_day": 2,
    "table_bytes_steady": 100 * 2**20,
    "table_bytes_last": 120 * 2**20,
    "table_bytes_last_of_steady": 1.2,
}  # fmt: skip


def test_bench_days_ratios_are_in_the_json_and_judged_in_the_table():
    ratios = report.ratios({"days": DAYS})
    assert ratios["day_last_of_first"] == DAYS["day_last_of_first"]
    assert ratios["table_bytes_last_of_steady"] == 1.2
    rows = {row.name: row for row in report.figures({"days": DAYS})}
    sweep = rows["days: expiry sweep on day 2"]
    assert (sweep.value, sweep.raw_value, sweep.ratio, sweep.met) == (950, 1000, 0.95, True)
    assert rows["days: inbox burst on day 2"].met is False
    size = rows["days: tables and indexes on day 2"]
    assert (size.value, size.raw_value, size.ratio, size.met) == (120.0, 100.0, 1.2, False)
    assert report.ratios({})["day_last_of_first"] is None
    # Beside each, the same rate over the machine's own speed of its day.
    assert ratios["day_last_of_first_of_reference"] == DAYS["day_last_of_first_of_reference"]
    inbox = rows["days: inbox burst on day 2, over the machine's speed that day"]
    assert (inbox.value, inbox.raw_value, inbox.ratio, inbox.met) == (0.02, 0.02, 1.0, True)


def test_bench_day_ratios_are_in_the_json():
    day = {"ratios": {"claims_together_of_alone": 0.8, "expiry_together_of_alone": 1.4}}
    ratios = report.ratios({"day": day})
    assert ratios["claims_together_of_alone"] == 0.8
    assert ratios["expiry_together_of_alone"] == 1.4
