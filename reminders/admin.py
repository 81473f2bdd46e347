from django.contrib import admin

from reminders import services
from reminders.models import Notification, ReminderSettings, ReminderSubscription, TimeoutJob


@admin.register(ReminderSettings)
class ReminderSettingsAdmin(admin.ModelAdmin):
    list_display = ["__str__", "slots", "batch_size", "tick_interval_ms", "paused", "gateway",
                    "updated_at"]  # fmt: skip
    readonly_fields = ["version", "updated_at"]
    fieldsets = [
        ("Queues", {"fields": ["slots", "batch_size", "tick_interval_ms", "paused"]}),
        ("Delivery", {"fields": ["gateway", "visibility_timeout_ms", "max_attempts", "backoff_ms",
                                 "merge_window_ms", "late_policy", "late_limit",
                                 "max_delivery_queue"]}),
        ("Console warnings", {"fields": ["backlog_warning", "lateness_warning_ms"]}),
        ("Version", {"fields": ["version", "updated_at"]}),
    ]  # fmt: skip

    def has_add_permission(self, request):
        return super().has_add_permission(request) and not ReminderSettings.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        services.reminder_settings_save(instance=obj)


@admin.register(TimeoutJob)
class TimeoutJobAdmin(admin.ModelAdmin):
    list_display = ["job_id", "topic", "biz_type", "biz_id", "status", "action_time", "attempts"]
    list_filter = ["status", "topic"]
    search_fields = ["=job_id", "=biz_id"]
    date_hierarchy = "action_time"
    readonly_fields = ["gmt_create", "gmt_modified"]
    show_full_result_count = False


@admin.register(ReminderSubscription)
class ReminderSubscriptionAdmin(admin.ModelAdmin):
    list_display = ["id", "user_id", "coupon", "remind_at", "status", "drop_reason", "sent_at"]
    list_filter = ["status"]
    search_fields = ["=user_id", "=coupon__id"]
    date_hierarchy = "remind_at"
    raw_id_fields = ["coupon"]
    list_select_related = ["coupon"]
    show_full_result_count = False


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["id", "user_id", "kind", "title", "created_at", "read_at"]
    list_filter = ["kind"]
    search_fields = ["=user_id", "dedup_key"]
    date_hierarchy = "created_at"
    show_full_result_count = False
