"""The live ``ReminderSettings`` row: validated edits, saved through the service (which bumps the
version workers poll), and the change page lists which running workers run that version. Every
save is in the admin history (who, when, which fields) through Django's own change log."""

from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse

from couponcenter.core.durations import ISO_DURATION_ADMIN
from reminders import services
from reminders.models import ReminderSettings
from reminders.selectors import queues, reminder_settings_get


@admin.register(ReminderSettings)
class ReminderSettingsAdmin(admin.ModelAdmin):
    formfield_overrides = ISO_DURATION_ADMIN
    list_display = [
        "__str__",
        "slots",
        "batch_size",
        "tick_interval_ms",
        "paused",
        "gateway",
        "updated_at",
    ]
    readonly_fields = ["version", "updated_at"]
    fieldsets = [
        ("Queues", {"fields": ["slots", "batch_size", "tick_interval_ms", "paused"]}),
        (
            "Delivery",
            {
                "fields": [
                    "gateway",
                    "prestage_ms",
                    "visibility_timeout_ms",
                    "max_attempts",
                    "backoff_ms",
                    "merge_window_ms",
                    "late_policy",
                    "late_limit",
                    "max_delivery_queue",
                ]
            },
        ),
        ("Notification policy", {"fields": ["push_cap_per_day", "over_cap"]}),
        ("Console warnings", {"fields": ["backlog_warning", "lateness_warning_ms"]}),
        (
            "Tenant quotas (each API account that is not staff)",
            {
                "fields": [
                    "quota_pending_per_topic",
                    "quota_creations_per_s",
                    "quota_attribute_bytes",
                ]
            },
        ),
        (
            "Retention (0 keeps forever; docs/retention.md)",
            {
                "fields": [
                    "timeout_job_retention",
                    "notification_read_retention",
                    "notification_unread_retention",
                    "subscription_retention",
                    "dead_letter_retention",
                ]
            },
        ),
        ("Version", {"fields": ["version", "updated_at"]}),
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and not ReminderSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context=None):
        # One row: go straight to it (created with the defaults on first visit).
        row = reminder_settings_get(max_age_s=0)
        return HttpResponseRedirect(
            reverse("admin:reminders_remindersettings_change", args=[row.pk])
        )

    def change_view(self, request: HttpRequest, object_id, form_url="", extra_context=None):
        live = reminder_settings_get(max_age_s=0)
        extra_context = {
            **(extra_context or {}),
            "current_version": live.version,
            "workers": [w for w in queues.workers(live=live) if w.live],
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request: HttpRequest, obj: ReminderSettings, form, change: bool) -> None:
        services.reminder_settings_save(instance=obj)
