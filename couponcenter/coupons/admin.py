"""Admin for the coupon domain. It holds no business logic: edits and actions go through services.

Coupons are cancelled, never deleted (claims and reminders point at them); claimed coupons are
read-only here, since a claim moves stock and writes an expiry task in one service transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from couponcenter.core.admin import EstimatedCountPaginator, ExactIdSearch
from couponcenter.core.durations import (
    ISO_DURATION_ADMIN,
    IsoDurationFormField,
    MaxDurationValidator,
    MinDurationValidator,
)
from couponcenter.core.errors import BusinessError
from couponcenter.coupons import selectors, services
from couponcenter.coupons.models import Account, Coupon, UserCoupon

# Counts on a coupon's change page (never per row of a list), by display name. The coupon domain
# counts its claims; an app that follows coupons adds its own from its admin module (reminders:
# the subscribed count), so this module knows none of them.
CouponCount = Callable[[int], int]
_coupon_counts: list[str] = []


def register_coupon_count(name: str, label: str, count: CouponCount) -> None:
    """Show ``count(coupon_id)`` as ``label`` on every coupon's change page (idempotent)."""

    @admin.display(description=label)
    def display(model_admin: CouponAdmin, coupon: Coupon) -> int:
        return count(coupon.pk)

    if name not in _coupon_counts:
        _coupon_counts.append(name)
    setattr(CouponAdmin, name, display)


def _claims_link(coupon: Coupon, count: int, html_id: str, *, status: str | None = None) -> str:
    """``count`` as a link to the claims list filtered to this coupon (and ``status``)."""
    query = {"coupon__id__exact": coupon.pk, **({"status__exact": status} if status else {})}
    url = f"{reverse('admin:couponcenter_usercoupon_changelist')}?{urlencode(query)}"
    return format_html('<a id="{}" href="{}">{}</a>', html_id, url, count)


MAX_SHIFT = timedelta(days=3650)


class MoveOpeningForm(forms.Form):
    shift = IsoDurationFormField(
        help_text="Move the opening time by this much: PT10M is later, -PT5M earlier.",
        validators=[MinDurationValidator(-MAX_SHIFT), MaxDurationValidator(MAX_SHIFT)],
    )


class CouponAdminForm(forms.ModelForm):
    """Validation is the model's ``clean()`` (run by the form), the same rules the services use."""

    class Meta:
        model = Coupon
        fields = sorted(services.COUPON_FIELDS)

    def clean(self) -> dict:
        if self.instance.pk and self.instance.status == Coupon.Status.CANCELLED:
            raise forms.ValidationError("A cancelled coupon cannot be changed.")
        return super().clean()


@admin.register(Coupon)
class CouponAdmin(admin.ModelAdmin):
    form = CouponAdminForm
    formfield_overrides = ISO_DURATION_ADMIN
    # What fits beside the navigation and the filters at 1280 px; the rest is on the change page
    # (priority and status are filters).
    list_display = [
        "id",
        "name",
        "status",
        "claim_opens_at",
        "total_stock",
        "claimed_count",
        "remaining",
    ]
    list_display_links = ["id", "name"]
    list_filter = ["status", "reminder_priority"]
    date_hierarchy = "claim_opens_at"
    search_fields = ["name"]
    readonly_fields = ["status", "claimed_count", "created_at", "updated_at"]
    actions = ["cancel_selected", "move_opening_time"]
    fieldsets = [
        (None, {"fields": ["name", "description", "status"]}),
        ("Claim window", {"fields": ["claim_opens_at", "claim_closes_at"]}),
        ("Stock", {"fields": ["total_stock", "claimed_count", "per_user_limit"]}),
        ("Validity of a claimed coupon", {"fields": ["valid_for", "expires_at"]}),
        ("Reminders", {"fields": ["reminder_lead", "reminder_priority"]}),
        (None, {"fields": ["created_at", "updated_at"]}),
    ]

    @admin.display(description="remaining")
    def remaining(self, coupon: Coupon) -> int:
        return coupon.remaining_stock

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None):
        # The change page (and its form's stock check) shows the exact count of claims, not the
        # column, which may lag a running sale by a moment (couponcenter.coupons.stock).
        coupon = super().get_object(request, object_id, from_field)
        if coupon is not None:
            coupon.claimed_count = selectors.coupon_claims_count(coupon=coupon)
        return coupon

    def get_readonly_fields(self, request: HttpRequest, obj: Coupon | None = None) -> list[str]:
        counts = ["claims", *_coupon_counts, "redeemed", "expired"] if obj is not None else []
        fields = [*self.readonly_fields, *counts]
        if obj is not None and obj.status == Coupon.Status.CANCELLED:
            return [*fields, *services.COUPON_FIELDS]
        return fields

    def get_fieldsets(self, request: HttpRequest, obj: Coupon | None = None):
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None:
            counts = ["claims", *_coupon_counts, "redeemed", "expired"]
            fieldsets.append(("Counts", {"fields": counts}))
        return fieldsets

    def _claim_counts(self, coupon: Coupon) -> dict[str, int]:
        if not hasattr(coupon, "_claim_counts"):
            coupon._claim_counts = selectors.coupon_claim_status_counts(coupon_id=coupon.pk)
        return coupon._claim_counts

    @admin.display(description="claims")
    def claims(self, coupon: Coupon) -> str:
        """The coupon's claims, listed (the count is the stock's exact one)."""
        return _claims_link(coupon, coupon.claimed_count, "coupon-claims")

    @admin.display(description="redeemed")
    def redeemed(self, coupon: Coupon) -> str:
        used = self._claim_counts(coupon)["used"]
        return _claims_link(coupon, used, "coupon-redeemed", status=UserCoupon.Status.USED)

    @admin.display(description="expired")
    def expired(self, coupon: Coupon) -> str:
        gone = self._claim_counts(coupon)["expired"]
        return _claims_link(coupon, gone, "coupon-expired", status=UserCoupon.Status.EXPIRED)

    def has_delete_permission(self, request: HttpRequest, obj: Coupon | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Coupon, form: CouponAdminForm, change: bool):
        fields = {name: form.cleaned_data[name] for name in form.changed_data}
        if change:
            services.coupon_update(coupon=obj, **fields)
        else:
            created = services.coupon_create(**form.cleaned_data)
            obj.pk = created.pk
            obj.refresh_from_db()

    @admin.action(description="Cancel selected coupons", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Coupon]) -> None:
        cancelled = 0
        for coupon in queryset.filter(status=Coupon.Status.ACTIVE):
            services.coupon_cancel(coupon=coupon)
            cancelled += 1
        self.message_user(request, f"Cancelled {cancelled} coupon(s).", messages.SUCCESS)

    @admin.action(description="Move the opening time of selected coupons", permissions=["change"])
    def move_opening_time(self, request: HttpRequest, queryset: QuerySet[Coupon]):
        """Through ``services.coupon_update``, which moves the coupons' reminders too."""
        form = MoveOpeningForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return TemplateResponse(
                request,
                "admin/couponcenter/coupon/move_opening.html",
                {
                    **self.admin_site.each_context(request),
                    "opts": self.opts,
                    "form": form,
                    "coupons": queryset[:100],
                    "count": min(queryset.count(), 1000),
                    "pks": list(queryset.values_list("pk", flat=True)[:1000]),
                    "title": "Move the opening time",
                },
            )
        moved, failed = 0, []
        for coupon in queryset[:1000]:
            try:
                services.coupon_update(
                    coupon=coupon, claim_opens_at=coupon.claim_opens_at + form.cleaned_data["shift"]
                )
                moved += 1
            except (ValidationError, BusinessError) as exc:
                failed.append(f"#{coupon.pk}: {'; '.join(getattr(exc, 'messages', [str(exc)]))}")
        self.message_user(
            request, f"Moved the opening time of {moved} coupon(s).", messages.SUCCESS
        )
        if failed:
            self.message_user(request, "Not moved: " + " | ".join(failed[:10]), messages.ERROR)
        return None


@admin.register(UserCoupon)
class UserCouponAdmin(ExactIdSearch, admin.ModelAdmin):
    """Fast at tens of millions of rows: no date hierarchy (two full scans for its year links), no
    ``-claimed_at`` ordering (an unindexed sort), no exact COUNT(*). The primary key follows claim
    order, so ``-id`` pages newest first through the index, and the paginator estimates the
    unfiltered count."""

    list_display = ["id", "user_id", "coupon", "status", "claimed_at", "expires_at", "used_at"]
    list_filter = ["status"]
    list_select_related = ["coupon"]
    raw_id_fields = ["coupon"]
    search_fields = ["=user_id"]
    search_help_text = "Exact end-user id."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    ordering = ["-id"]
    list_per_page = 50

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # One coupon's claims, as its change page links them (the unique (coupon, user_id,
        # seq) index leads with the coupon).
        return lookup == "coupon__id__exact" or super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UserCoupon | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: UserCoupon | None = None) -> bool:
        return False


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ["user", "end_user_id"]
    list_select_related = ["user"]
    search_fields = ["user__username", "=end_user_id"]
    raw_id_fields = ["user"]
