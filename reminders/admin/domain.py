"""Admin for the reminder tables. Every list is built for tens of millions of rows: no full
COUNT(*) (``show_full_result_count = False`` and an estimated count when unfiltered), exact-match
searches that use an index, and no filter that lists a big related table."""

from django.contrib import admin

from couponcenter.core.admin import EstimatedCountPaginator, exact_id
from reminders.models import Notification, ReminderSubscription, TimeoutJob


@admin.register(TimeoutJob)
class TimeoutJobAdmin(admin.ModelAdmin):
    list_display = ["job_id", "topic", "biz_type", "biz_id", "status", "action_time", "slot",
                    "attempts", "last_error"]  # fmt: skip
    list_filter = ["status", "topic"]
    search_fields = ["=job_id", "=biz_id"]
    search_help_text = "Exact job id or business id."
    readonly_fields = ["gmt_create", "gmt_modified"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        if (pk := exact_id(term)) is not None:
            return queryset.filter(job_id=pk) | queryset.filter(biz_id=term), False
        return queryset.filter(biz_id=term), False


@admin.register(ReminderSubscription)
class ReminderSubscriptionAdmin(admin.ModelAdmin):
    list_display = ["id", "user_id", "coupon", "remind_at", "status", "priority", "slot",
                    "drop_reason", "sent_at"]  # fmt: skip
    list_filter = ["status", "priority"]
    search_fields = ["=user_id", "=coupon__id"]
    search_help_text = "Exact end-user id or coupon id."
    raw_id_fields = ["coupon"]
    list_select_related = ["coupon"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50

    def get_search_results(self, request, queryset, search_term):
        if not search_term.strip():
            return queryset, False
        if (pk := exact_id(search_term)) is None:
            return queryset.none(), False
        return queryset.filter(user_id=pk) | queryset.filter(coupon_id=pk), False


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["id", "user_id", "kind", "title", "created_at", "read_at"]
    list_filter = ["kind"]
    search_fields = ["=user_id"]
    search_help_text = "Exact end-user id."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50

    def get_search_results(self, request, queryset, search_term):
        if not search_term.strip():
            return queryset, False
        if (pk := exact_id(search_term)) is None:
            return queryset.none(), False
        return queryset.filter(user_id=pk), False
