"""Admin for the reminder tables. Every list is built for tens of millions of rows: no full
COUNT(*) (``show_full_result_count = False`` and an estimated count when unfiltered), exact-match
searches that use an index, and no filter that lists a big related table."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from couponcenter.core.admin import EstimatedCountPaginator, ExactIdSearch, exact_id
from couponcenter.core.errors import BusinessError
from couponcenter.core.humanize import when
from reminders import attributes
from reminders.engine import queue
from reminders.models import Notification, ReminderSubscription, TimeoutJob
from reminders.selectors import timeout_job_attribute_text
from reminders.selectors.queues import ms_to_datetime
from reminders.selectors.timeout_topics import timeout_topic_spec, timeout_topic_specs
from reminders.services import (
    timeout_job_cancel,
    timeout_job_end,
    timeout_job_ensure,
    timeout_job_reschedule,
)
from reminders.services.dead_letters import dead_letters_requeue


def _error_is_past(job: TimeoutJob) -> bool:
    """The job's last error belongs to an earlier attempt: it fired since, or was cancelled."""
    return job.status in (TimeoutJob.Status.PROCESSED, TimeoutJob.Status.CANCELLED)


# Jobs one "cancel" action handles (one conditional UPDATE and one Redis call each).
CANCEL_CAP = 1000
# A job's change page shows this much of its attribute's stored JSON text.
ATTRIBUTE_SHOWN_CHARS = 4000


class _AttributeFormField(forms.JSONField):
    """Django's field, with text nested past the decoder's recursion refused as bad input (it
    catches only ``JSONDecodeError``); what decodes is then checked by ``attributes.check``."""

    def to_python(self, value):
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError("Nested too deeply.", code="invalid") from None

    def bound_data(self, data, initial):
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return forms.fields.InvalidJSONInput(data)

    def prepare_value(self, value):
        # A lone surrogate (refused, shown again in the form) as its JSON escape: the page must
        # still encode as UTF-8.
        return super().prepare_value(value).encode("utf-8", "backslashreplace").decode()


class TimeoutJobForm(forms.ModelForm):
    class Meta:
        model = TimeoutJob
        fields = ["topic", "biz_type", "biz_id", "action_time", "attribute"]
        field_classes = {"attribute": _AttributeFormField}

    def clean_attribute(self):
        value = self.cleaned_data["attribute"]
        try:
            attributes.check(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return value

    def clean_topic(self):
        topic = self.cleaned_data["topic"]
        if self.instance.pk is None and timeout_topic_spec(topic) is None:
            raise forms.ValidationError(f"Unknown topic; known: {sorted(timeout_topic_specs())}")
        return topic


@admin.register(TimeoutJob)
class TimeoutJobAdmin(admin.ModelAdmin):
    """Every write goes through the services the API uses: a new job is created and indexed by
    ``timeout_job_ensure``, a new action time moves the Redis entry too
    (``timeout_job_reschedule``), and the cancel action is ``timeout_job_cancel``. The engine's
    fields (slot, status, attempts) are never edited by hand."""

    form = TimeoutJobForm
    list_display = ["job_id", "topic", "business_key", "status", "action_time", "attempts", "error"]
    list_filter = ["status", "topic"]
    search_fields = ["=job_id", "=biz_id"]
    search_help_text = (
        "Exact job id, business id, business key as type:id (order:123), or error:<text> "
        "(dead jobs whose last error contains it)."
    )
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50
    actions = ["cancel_jobs", "end_jobs", "requeue_dead_jobs"]
    ENGINE_FIELDS = [
        "job_id",
        "status",
        "slot",
        "attempts",
        "error_now",
        "created",
        "modified",
    ]
    change_form_template = "admin/reminders/timeoutjob/change_form.html"

    DETAIL_FIELDS = ["place_in_redis", "attempt_history"]

    @admin.display(description="business key", ordering="biz_id")
    def business_key(self, obj):
        return f"{obj.biz_type}:{obj.biz_id}"

    @admin.display(description="last error")
    def error(self, obj):
        text = (obj.last_error[:80] + "…") if len(obj.last_error) > 80 else obj.last_error
        if text and _error_is_past(obj):
            return format_html('<span class="tj-earlier">earlier: {}</span>', text)
        return text

    @admin.display(description="Last error")
    def error_now(self, obj):
        """The last error as what it is now: a job that fired or was cancelled after it (a
        requeued job that then succeeded) has none now, and the old one is history."""
        if not obj.last_error:
            return "none"
        if _error_is_past(obj):
            return format_html(
                '<span id="tj-error" class="tj-earlier">none now ({}); before that: {}</span>',
                obj.get_status_display().lower(),
                obj.last_error,
            )
        return format_html('<span id="tj-error">{}</span>', obj.last_error)

    @admin.display(description="Created", ordering="gmt_create")
    def created(self, obj):
        return when(obj.gmt_create)

    @admin.display(description="Last changed", ordering="gmt_modified")
    def modified(self, obj):
        return when(obj.gmt_modified)

    # --- the job page: read-only unless pending; cancel and requeue buttons ----------------------

    def has_change_permission(self, request, obj=None):
        # A job that fired, died or was cancelled is history: its page is for reading (its
        # buttons, cancel and requeue, check the change permission themselves).
        if obj is not None and obj.status != TimeoutJob.Status.PENDING:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False  # a job is cancelled or ended, never deleted (its Redis entry would stay)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        job = self.get_object(request, object_id)
        may = job is not None and super().has_change_permission(request, job)
        context = {
            "show_save_and_add_another": False,
            "tj_cancel": may and job.status == TimeoutJob.Status.PENDING,
            "tj_requeue": may and job.status == TimeoutJob.Status.DEAD,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self):
        urls = [
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="reminders_timeoutjob_cancel",
            ),
            path(
                "<path:object_id>/requeue/",
                self.admin_site.admin_view(self.requeue_view),
                name="reminders_timeoutjob_requeue",
            ),
        ]
        return urls + super().get_urls()

    def _one_job(self, request, object_id) -> TimeoutJob:
        if request.method != "POST":
            raise PermissionDenied
        job = self.get_object(request, object_id)
        if job is None:
            raise Http404
        if not super().has_change_permission(request, job):
            raise PermissionDenied
        return job

    def _back_to(self, job) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:reminders_timeoutjob_change", args=[job.pk]))

    def cancel_view(self, request, object_id):
        job = self._one_job(request, object_id)
        try:
            timeout_job_cancel(job=job)
        except BusinessError as refused:
            self.message_user(request, f"Not cancelled: {refused.message}", messages.ERROR)
            return self._back_to(job)
        self.log_change(request, job, "Cancelled from its page.")
        self.message_user(request, f"Job {job.pk} cancelled.", messages.SUCCESS)
        return self._back_to(job)

    def requeue_view(self, request, object_id):
        job = self._one_job(request, object_id)
        if job.status != TimeoutJob.Status.DEAD:
            self.message_user(request, "Only a dead job is requeued.", messages.ERROR)
            return self._back_to(job)
        result = dead_letters_requeue(topic=job.topic, slot=job.slot, job_ids=[str(job.pk)])
        if result.skipped:
            self.message_user(
                request,
                "Not requeued: a newer job is pending for its business key.",
                messages.ERROR,
            )
        else:
            self.log_change(request, job, "Requeued from its page.")
            self.message_user(request, f"Job {job.pk} requeued.", messages.SUCCESS)
        return self._back_to(job)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.ENGINE_FIELDS
        fixed = [
            *self.ENGINE_FIELDS,
            *self.DETAIL_FIELDS,
            "topic",
            "biz_type",
            "biz_id",
            "stored_attribute",
        ]
        if obj.status != TimeoutJob.Status.PENDING:  # fired, firing or cancelled: history
            fixed.append("action_time")
        return fixed

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["topic", "biz_type", "biz_id", "action_time", "attribute", *self.ENGINE_FIELDS]
        return [
            "topic",
            "biz_type",
            "biz_id",
            "action_time",
            "stored_attribute",
            *self.ENGINE_FIELDS,
            *self.DETAIL_FIELDS,
        ]

    def get_queryset(self, request):
        """Jobs without their attribute decoded: the list never shows it and the change page
        shows its stored text (``stored_attribute``), so both open even for a value nested too
        deep to decode; the services the actions call do not read it."""
        return super().get_queryset(request).defer("attribute")

    @admin.display(description="Attribute")
    def stored_attribute(self, obj):
        head, chars = timeout_job_attribute_text(job_id=obj.pk, max_chars=ATTRIBUTE_SHOWN_CHARS)
        if chars > len(head):
            return format_html(
                '<pre id="tj-attribute">{}…</pre>the first {} of {} characters',
                head,
                len(head),
                chars,
            )
        return format_html('<pre id="tj-attribute">{}</pre>', head)

    @admin.display(description="Place in Redis")
    def place_in_redis(self, obj):
        """Where the engine holds the job now, read live from its slot."""
        try:
            where = queue.place(obj.topic, obj.slot, str(obj.pk))
        except Exception as exc:  # noqa: BLE001 - the page still shows the row
            return f"unknown: Redis did not answer ({exc.__class__.__name__})"
        if where.at_ms is None:
            return f"absent from {obj.topic} slot {obj.slot} (fired, cancelled, or not indexed)"
        at = ms_to_datetime(where.at_ms)
        label = {"scheduled": "due", "in flight": "visible again", "dead": "died"}[where.where]
        return format_html(
            '<span id="tj-place">{}</span> in {} slot {}: {} {}',
            where.where,
            obj.topic,
            obj.slot,
            label,
            when(at),
        )

    @admin.display(description="Attempts")
    def attempt_history(self, obj):
        entries = obj.history or []
        if not entries:
            return "none settled yet"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (e.get("attempt"), when(e.get("at")), e.get("outcome"), e.get("error") or "")
                for e in entries
            ),
        )
        return format_html(
            '<table id="tj-history"><thead><tr><th>Attempt</th><th>Settled</th><th>Outcome</th>'
            "<th>Error</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def save_model(self, request, obj, form, change):
        if not change:
            job, created = timeout_job_ensure(
                topic=obj.topic,
                biz_type=obj.biz_type,
                biz_id=obj.biz_id,
                action_time=obj.action_time,
                attribute=obj.attribute,
            )
            obj.pk = job.pk
            if not created:
                self.message_user(
                    request,
                    f"A job was pending for this key already: job {job.pk}, left as it was.",
                    messages.WARNING,
                )
            return
        if "action_time" in form.changed_data:
            try:
                timeout_job_reschedule(job=obj, action_time=form.cleaned_data["action_time"])
            except BusinessError as refused:
                self.message_user(request, f"Not moved: {refused.message}", messages.ERROR)

    def save_related(self, request, form, formsets, change):
        pass  # no related objects, and nothing may be saved around the services

    def _confirmed(
        self,
        request,
        queryset,
        action: str,
        label: str,
        *,
        ask_reason: bool = False,
        refused: bool = False,
    ):
        """None once the operator confirmed; else the confirmation page (what it will touch).
        ``ask_reason``: the page asks why (required; ``refused``: it was left empty)."""
        if request.POST.get("post") == "yes" and not ask_reason:
            return None
        context = {
            "ask_reason": ask_reason,
            "reason_missing": refused,
            **self.admin_site.each_context(request),
            "title": "Are you sure?",
            "action": action,
            "action_label": label,
            "count": queryset.count(),
            "cap": CANCEL_CAP,
            "sample": list(queryset.order_by("pk")[:20]),
            "select_across": request.POST.get("select_across") == "1",
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "back": request.get_full_path(),
        }
        return TemplateResponse(request, "admin/reminders/timeoutjob/confirm_action.html", context)

    @admin.action(description="Cancel the selected pending jobs", permissions=["change"])
    def cancel_jobs(self, request, queryset):
        page = self._confirmed(request, queryset, "cancel_jobs", "Cancel pending jobs")
        if page is not None:
            return page
        cancelled, left = 0, 0
        for job in queryset.order_by("pk")[:CANCEL_CAP]:
            try:
                timeout_job_cancel(job=job)
                cancelled += 1
            except BusinessError:
                left += 1  # fired, firing or cancelled already
        self.message_user(
            request,
            f"Cancelled {cancelled} job(s); {left} were not pending and were left alone"
            + (f" (at most {CANCEL_CAP:,} per action)." if cancelled + left >= CANCEL_CAP else "."),
        )

    @admin.action(
        description="End the selected pending or stuck running jobs", permissions=["change"]
    )
    def end_jobs(self, request, queryset):
        """What a cancel refuses: a job stuck ``running`` (its worker stalled or died mid-firing)
        is ended through ``timeout_job_end``, with the reason the operator gives."""
        reason = " ".join(request.POST.get("reason", "").split())
        if request.POST.get("post") != "yes" or not reason:
            refused = request.POST.get("post") == "yes"  # confirmed with no reason
            return self._confirmed(
                request,
                queryset,
                "end_jobs",
                "End pending or running jobs",
                ask_reason=True,
                refused=refused,
            )
        ended, left = 0, 0
        for job in queryset.order_by("pk")[:CANCEL_CAP]:
            try:
                timeout_job_end(job=job, reason=reason, by=request.user.get_username())
                ended += 1
            except BusinessError:
                left += 1  # fired or cancelled already, or held by another transaction
        self.message_user(
            request,
            f"Ended {ended} job(s); {left} were not pending or running (or busy) and "
            "were left alone.",
        )

    @admin.action(description="Requeue the selected dead jobs", permissions=["change"])
    def requeue_dead_jobs(self, request, queryset):
        """Through the dead-letter service (rows, then the engine's dead queue), per slot."""
        page = self._confirmed(request, queryset, "requeue_dead_jobs", "Requeue dead jobs")
        if page is not None:
            return page
        by_slot: dict[tuple[str, int], list[str]] = {}
        dead = queryset.filter(status=TimeoutJob.Status.DEAD).order_by("pk")[:CANCEL_CAP]
        for pk, topic, slot in dead.values_list("pk", "topic", "slot"):
            by_slot.setdefault((topic, slot), []).append(str(pk))
        moved = skipped = 0
        for (topic, slot), job_ids in by_slot.items():
            result = dead_letters_requeue(topic=topic, slot=slot, job_ids=job_ids)
            moved += result.rows_fixed
            skipped += len(result.skipped)
        self.message_user(
            request,
            f"Requeued {moved} dead job(s)"
            + (f"; {skipped} skipped (a newer job is pending for their key)" if skipped else "")
            + ". Jobs that were not dead were left alone.",
        )

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.startswith("error:"):  # the dead ones' error text (few rows: dead only)
            text = term.removeprefix("error:").strip()
            return queryset.filter(status=TimeoutJob.Status.DEAD, last_error__icontains=text), False
        if ":" in term and exact_id(term) is None:  # "order:123": a business key
            biz_type, _, biz_id = term.partition(":")
            return queryset.filter(biz_type=biz_type, biz_id=biz_id), False
        if (pk := exact_id(term)) is not None:
            return queryset.filter(job_id=pk) | queryset.filter(biz_id=term), False
        return queryset.filter(biz_id=term), False


@admin.register(ReminderSubscription)
class ReminderSubscriptionAdmin(ExactIdSearch, admin.ModelAdmin):
    list_display = [
        "id",
        "user_id",
        "coupon",
        "remind_at",
        "status",
        "priority",
        "slot",
        "drop_reason",
        "sent_at",
    ]
    list_filter = ["status", "priority"]
    search_fields = ["=user_id", "=coupon__id"]
    search_help_text = "Exact end-user id or coupon id."
    raw_id_fields = ["coupon"]
    list_select_related = ["coupon"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50


@admin.register(Notification)
class NotificationAdmin(ExactIdSearch, admin.ModelAdmin):
    list_display = ["id", "user_id", "kind", "title", "visible_at", "push", "held", "read_at"]
    list_filter = ["kind", "push", "held"]
    search_fields = ["=user_id"]
    search_help_text = "Exact end-user id."
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50
