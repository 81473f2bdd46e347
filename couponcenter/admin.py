"""Admin for the coupon domain. It holds no business logic: edits and actions go through services.

Coupons are cancelled, never deleted (claims and reminders point at them); claimed coupons are
read-only here, since a claim moves stock and writes an expiry task in one service transaction.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from couponcenter import services
from couponcenter.models import Account, Coupon, UserCoupon


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
    list_display = [
        "id", "name", "status", "claim_opens_at", "claim_closes_at", "total_stock",
        "claimed_count", "remaining", "per_user_limit", "reminder_priority",
    ]  # fmt: skip
    list_display_links = ["id", "name"]
    list_filter = ["status", "reminder_priority"]
    date_hierarchy = "claim_opens_at"
    search_fields = ["name"]
    readonly_fields = ["status", "claimed_count", "created_at", "updated_at"]
    actions = ["cancel_selected"]
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

    def get_readonly_fields(self, request: HttpRequest, obj: Coupon | None = None) -> list[str]:
        if obj is not None and obj.status == Coupon.Status.CANCELLED:
            return [*self.readonly_fields, *services.COUPON_FIELDS]
        return self.readonly_fields

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


@admin.register(UserCoupon)
class UserCouponAdmin(admin.ModelAdmin):
    list_display = ["id", "user_id", "coupon", "status", "claimed_at", "expires_at", "used_at"]
    list_filter = ["status"]
    list_select_related = ["coupon"]
    date_hierarchy = "claimed_at"
    raw_id_fields = ["coupon"]
    search_fields = ["=user_id"]
    search_help_text = "Exact end-user id."
    # The table holds tens of millions of rows: never COUNT(*) it for the "n total" line.
    show_full_result_count = False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[UserCoupon], search_term: str
    ) -> tuple[QuerySet[UserCoupon], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not term.isdigit() or len(term) > 18:
            return queryset.none(), False
        return queryset.filter(user_id=int(term)), False

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
