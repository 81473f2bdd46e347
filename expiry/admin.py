"""Admin for the expiry tasks (read-only, built for tens of millions of rows) and the settings."""

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse

from couponcenter.core.admin import EstimatedCountPaginator, ExactIdSearch
from couponcenter.core.durations import ISO_DURATION_ADMIN

from . import services
from .models import ExpirySettings, ExpiryTask


@admin.register(ExpiryTask)
class ExpiryTaskAdmin(ExactIdSearch, admin.ModelAdmin):
    list_display = ("id", "user_coupon", "expire_at", "status", "updated_at")
    list_filter = ("status",)
    # No date_hierarchy: its year links are a DISTINCT over the whole table (seconds at 50M rows).
    # Newest first by primary key (an index walk), and an estimated count when unfiltered.
    ordering = ("-id",)
    paginator = EstimatedCountPaginator
    raw_id_fields = ("user_coupon",)
    # An id, matched exactly, so the search uses the (user_id) index (Django's own "=" search
    # compares the id as text, which no index serves).
    search_fields = ("=user_coupon__user_id",)
    search_help_text = "Exact end-user id."
    # A COUNT(*) over the whole table on every page would take seconds at this size.
    show_full_result_count = False
    list_per_page = 50
    readonly_fields = ("user_coupon", "expire_at", "status", "created_at", "updated_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks are written by claims, nothing else

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # the sweeper and redeem own the status


class ExpirySettingsForm(forms.ModelForm):
    class Meta:
        model = ExpirySettings
        fields = ("batch_size", "interval", "retention", "user_coupon_retention")
        help_texts = {
            "batch_size": "Tasks per transaction. Sweepers pick a change up on their next pass.",
            "interval": "Longest sleep between passes, e.g. 00:01:00.",
            "retention": "Processed tasks older than this are deleted, e.g. P7D; 0 keeps them "
            "forever.",
            "user_coupon_retention": "Used and expired user coupons are deleted this long after "
            "their use or expiry, once their coupon can no longer be claimed (cancelled, or its "
            "claims closed) for as long: a user's claims count against the per-user limit, so "
            "those of a coupon still on sale are kept. E.g. P180D; 0 keeps them forever.",
        }


@admin.register(ExpirySettings)
class ExpirySettingsAdmin(admin.ModelAdmin):
    form = ExpirySettingsForm
    formfield_overrides = ISO_DURATION_ADMIN
    list_display = (
        "__str__",
        "batch_size",
        "interval",
        "retention",
        "user_coupon_retention",
        "updated_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not ExpirySettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context=None):
        # One row: go straight to it (creating it with the defaults on first visit).
        config = services.expiry_settings_get(max_age_s=0)
        return HttpResponseRedirect(reverse("admin:expiry_expirysettings_change", args=[config.pk]))

    def save_model(self, request: HttpRequest, obj: ExpirySettings, form, change: bool) -> None:
        services.expiry_settings_save(instance=obj)
