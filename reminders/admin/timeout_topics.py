"""Generic timeout topics as data: created and changed through ``services.timeout_topic_save``
(the model's bounds, then the workers pick the change up while they run)."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.utils.html import format_html

from couponcenter.core.errors import BusinessError
from reminders.engine.knobs import TOPIC_KNOBS
from reminders.models import TimeoutTopic
from reminders.selectors import queues
from reminders.selectors.timeout_topics import timeout_topic_specs
from reminders.services import timeout_topic_delete, timeout_topic_save
from reminders.timeout_topic_rules import FIRING_KNOBS, TIMEOUT_TOPIC_KNOBS


def _backlog_text(data) -> str:
    if data is None:
        return "-"
    return f"{data.store} / {data.due} / {data.prepare} / {data.dead}"


class TimeoutTopicForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="http: the signing secret, whsec_<base64> (24 bytes or more) or text of 32 bytes "
        "or more. Left empty on a change: kept. A new one: the old one signs as well for "
        "WEBHOOK_SECRET_OVERLAP_S.",
    )

    class Meta:
        model = TimeoutTopic
        fields = [
            "name",
            "type",
            "target",
            "secret",
            "legacy_signature",
            "allow_http",
            "paused",
            "owner_user",
            "owner_group",
            "fair_key",
            *(knob.name for knob in TIMEOUT_TOPIC_KNOBS),
        ]

    def clean_secret(self):
        secret = self.cleaned_data.get("secret") or ""
        return secret or (self.instance.secret if self.instance.pk else "")


@admin.register(TimeoutTopic)
class TimeoutTopicAdmin(admin.ModelAdmin):
    form = TimeoutTopicForm
    list_display = [
        "name",
        "type",
        "target",
        "slots",
        "concurrency",
        "timeout_ms",
        "rate_limit_per_s",
        "fair_key",
        "state",
        "owner_user",
        "owner_group",
    ]
    change_list_template = "admin/reminders/timeouttopic/change_list.html"
    list_filter = ["type", "paused"]
    search_fields = ["name"]
    actions = ["pause", "resume", "end_rotation"]
    fieldsets = [
        (None, {"fields": ["name", "type", "target", "secret", "allow_http", "paused"]}),
        ("Signatures", {"fields": ["legacy_signature", "previous_secret_until"]}),
        ("Who may use it", {"fields": ["owner_user", "owner_group"]}),
        ("Firing", {"fields": [*(knob.name for knob in FIRING_KNOBS), "fair_key"]}),
        ("Engine", {"fields": [knob.name for knob in TOPIC_KNOBS]}),
    ]
    raw_id_fields = ["owner_user"]

    @admin.display(description="state", ordering="paused")
    def state(self, obj):
        # Running is the normal state: a red cross for "not paused" read as a fault.
        return format_html('<span class="cc-bad">{}</span>', "PAUSED") if obj.paused else "running"

    def get_list_display(self, request):
        """The columns, with each topic's backlog read from Redis once for the page."""
        counts = {t.topic: t for t in queues.backlog().topics}

        @admin.display(description="scheduled / due / in flight / dead")
        def backlog(obj):
            return _backlog_text(counts.get(obj.name))

        request.cc_topic_backlog = counts
        return [*self.list_display[:3], backlog, *self.list_display[3:]]

    def changelist_view(self, request, extra_context=None):
        """The list of topics kept as data, then the built-in ones from settings (read-only
        here: ``TIMEOUT_TOPICS``), so every topic a job may name is on one page."""
        response = super().changelist_view(request, extra_context)
        if hasattr(response, "context_data"):
            counts = getattr(request, "cc_topic_backlog", None) or {
                t.topic: t for t in queues.backlog().topics
            }
            q = (request.GET.get("q") or "").strip().lower()
            response.context_data["builtin_topics"] = [
                {"spec": spec, "backlog": _backlog_text(counts.get(name))}
                for name, spec in timeout_topic_specs().items()
                if spec.read_only and q in name.lower()
            ]
        return response

    def get_readonly_fields(self, request, obj=None):
        # The name: its jobs carry it. The overlap: set when the secret changes.
        return ["name", "previous_secret_until"] if obj is not None else ["previous_secret_until"]

    def save_model(self, request, obj, form, change):
        try:
            timeout_topic_save(topic=obj)
        except ValidationError as exc:  # the form ran the same checks: a race at most
            self.message_user(request, f"Not saved: {exc}", messages.ERROR)

    def delete_model(self, request, obj):
        try:
            purged = timeout_topic_delete(topic=obj)
        except BusinessError as refused:
            self.message_user(request, f"Not deleted: {refused.message}", messages.ERROR)
            return
        if purged:
            self.message_user(request, f"{obj.name}: its {purged} finished jobs deleted with it.")

    def delete_queryset(self, request, queryset):
        for topic in queryset:
            self.delete_model(request, topic)

    @admin.action(description="Pause the selected topics", permissions=["change"])
    def pause(self, request, queryset):
        for topic in queryset:
            timeout_topic_save(topic=topic, paused=True)
        self.message_user(request, f"{queryset.count()} topics paused.")

    @admin.action(description="Resume the selected topics", permissions=["change"])
    def resume(self, request, queryset):
        for topic in queryset:
            timeout_topic_save(topic=topic, paused=False)
        self.message_user(request, f"{queryset.count()} topics resumed.")

    @admin.action(
        description="End the secret rotation: only the current secret signs", permissions=["change"]
    )
    def end_rotation(self, request, queryset):
        for topic in queryset:
            timeout_topic_save(topic=topic, previous_secret="", previous_secret_until=None)
        self.message_user(
            request, f"{queryset.count()} topics sign with their current secret only."
        )
