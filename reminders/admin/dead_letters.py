"""Dead letters: the engine's Redis dead queues in the admin, as django-rq shows its queues.

``DeadLetter`` is an unmanaged model: the changelist is our own view reading Redis through
``reminders.selectors.dead_letters``; actions go through ``reminders.services.dead_letters`` after a
confirmation page that says how many entries they touch, and each is written to the admin log.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from reminders.models import DeadLetter
from reminders.selectors import dead_letters, queues
from reminders.services import dead_letters as dead_letter_services

PAGE_SIZE = 100
ACTIONS = {
    "requeue_selected": "Requeue selected dead letters",
    "purge_selected": "Purge selected dead letters",
    "requeue_matching": "Requeue all matching the filter (at most {cap:,})",
}


def _filters(params) -> dict:
    """topic / slot / q from the query string (or the action form), ignoring bad values."""
    known = queues.topic_slot_counts()
    topic = params.get("topic") or None
    topic = topic if topic in known else None
    slot = params.get("slot", "")
    slot = int(slot) if slot.isdigit() and (topic is None or int(slot) < known[topic]) else None
    return {"topic": topic, "slot": slot, "q": (params.get("q") or "").strip()[:100]}


ROW_PAGES = {
    "job": "admin:reminders_timeoutjob_change",
    "subscription": "admin:reminders_remindersubscription_change",
}


def _row_url(row: tuple[str, int] | None) -> str:
    """The admin page of a dead letter's row (its timeout job or reminder subscription)."""
    return reverse(ROW_PAGES[row[0]], args=[row[1]]) if row else ""


def _query(f: dict, **extra) -> str:
    pairs = {"topic": f["topic"], "slot": f["slot"], "q": f["q"], **extra}
    return urlencode({k: v for k, v in pairs.items() if v not in (None, "")})


@admin.register(DeadLetter)
class DeadLetterAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def change_view(self, request: HttpRequest, object_id, form_url="", extra_context=None):
        try:
            topic, slot, job_id = dead_letters.parse_dead_letter_key(object_id)
        except ValueError:
            topic, slot, job_id = "", "", object_id
        url = reverse("admin:reminders_deadletter_changelist")
        return HttpResponseRedirect(
            f"{url}?{urlencode({'topic': topic, 'slot': slot, 'q': job_id})}"
        )

    def delete_view(self, request: HttpRequest, object_id, extra_context=None):
        return self.change_view(request, object_id)

    def history_view(self, request: HttpRequest, object_id, extra_context=None):
        return self.change_view(request, object_id)

    # --- the list ---------------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._action(request)
        f = _filters(request.GET)
        page_no = request.GET.get("p", "")
        page_no = min(int(page_no), 10_000) if page_no.isdigit() else 0
        page = dead_letters.dead_letter_list(
            topic=f["topic"],
            slot=f["slot"],
            search=f["q"],
            offset=page_no * PAGE_SIZE,
            limit=PAGE_SIZE,
        )
        for letter in page.letters:
            letter.row_url = _row_url(letter.row)
        counts = dead_letters.dead_counts()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Dead letters",
            "page": page,
            "filters": f,
            "topics": [
                {
                    "name": t,
                    "dead": sum(c),
                    "slots": [(s, n) for s, n in enumerate(c)],
                    "query": _query({"topic": t, "slot": None, "q": f["q"]}),
                }
                for t, c in counts.items()
            ],
            "slot_links": [
                (s, n, _query({**f, "slot": s}))
                for s, n in enumerate(counts.get(f["topic"], []))
                if n or s == f["slot"]
            ],
            "all_slots_query": _query({**f, "slot": None}),
            "all_topics_query": _query({"topic": None, "slot": None, "q": f["q"]}),
            "actions": self._allowed_actions(request, f),
            "page_no": page_no,
            "prev_query": _query(f, p=page_no - 1) if page_no > 0 else None,
            "next_query": _query(f, p=page_no + 1) if page.has_more else None,
            "cap": dead_letter_services.REQUEUE_CAP,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/reminders/deadletter/list.html", context)

    def _allowed_actions(self, request: HttpRequest, f: dict) -> list[tuple[str, str]]:
        out = []
        if self.has_change_permission(request):
            out.append(("requeue_selected", ACTIONS["requeue_selected"]))
            if f["topic"]:
                cap = dead_letter_services.REQUEUE_CAP
                out.append(("requeue_matching", ACTIONS["requeue_matching"].format(cap=cap)))
        if self.has_delete_permission(request):
            out.append(("purge_selected", ACTIONS["purge_selected"]))
        return out

    # --- actions: confirm, then do, then log ------------------------------------------------------

    def _action(self, request: HttpRequest) -> HttpResponse:
        f = _filters(request.POST)
        action = request.POST.get("action", "")
        back = f"{reverse('admin:reminders_deadletter_changelist')}?{_query(f)}"
        if action not in dict(self._allowed_actions(request, f)):
            self.message_user(request, "Choose an action you may run.", messages.WARNING)
            return HttpResponseRedirect(back)
        if action == "requeue_matching":
            letters = []
            count = min(
                dead_letters.dead_matching_count(topic=f["topic"], slot=f["slot"]),
                dead_letter_services.REQUEUE_CAP,
            )
        else:
            letters = dead_letters.dead_letters_get(request.POST.getlist("_selected_action"))
            count = len(letters)
        if count == 0:
            self.message_user(request, "No dead letters selected (or none left).", messages.WARNING)
            return HttpResponseRedirect(back)
        if request.POST.get("confirm") != "yes":
            return TemplateResponse(
                request,
                "admin/reminders/deadletter/confirm.html",
                {
                    **self.admin_site.each_context(request),
                    "opts": self.opts,
                    "title": "Are you sure?",
                    "action": action,
                    "action_label": ACTIONS[action].format(cap=dead_letter_services.REQUEUE_CAP),
                    "count": count,
                    "letters": letters[:50],
                    "selected": [d.key for d in letters],
                    "filters": f,
                    "back": back,
                },
            )
        done = self._run(request, action, f, letters)
        verb = "Purged" if action == "purge_selected" else "Requeued"
        self.message_user(request, f"{verb} {done} dead letter(s).", messages.SUCCESS)
        return HttpResponseRedirect(back)

    def _run(self, request: HttpRequest, action: str, f: dict, letters: list[DeadLetter]) -> int:
        if action == "requeue_matching":
            result = dead_letter_services.dead_letters_requeue_matching(
                topic=f["topic"], slot=f["slot"]
            )
            where = f"{f['topic']} slot {'*' if f['slot'] is None else f['slot']}"
            summary = DeadLetter(
                key=dead_letters.dead_letter_key(f["topic"], f["slot"] or 0, "*"),
                topic=f["topic"],
                slot=f["slot"] or 0,
                job_id="*",
            )
            message = (
                f"Requeued {result.requeued} dead letters matching {where} "
                f"(cap {dead_letter_services.REQUEUE_CAP}); {result.rows_fixed} rows reset."
            )
            self._log(request, [summary], CHANGE, message)
            return result.requeued
        done = 0
        by_slot: dict[tuple[str, int], list[DeadLetter]] = {}
        for letter in letters:
            by_slot.setdefault((letter.topic, letter.slot), []).append(letter)
        for (topic, slot), group in by_slot.items():
            ids = [d.job_id for d in group]
            if action == "purge_selected":
                done += dead_letter_services.dead_letters_purge(topic=topic, slot=slot, job_ids=ids)
            else:
                done += dead_letter_services.dead_letters_requeue(
                    topic=topic, slot=slot, job_ids=ids
                ).requeued
        flag = DELETION if action == "purge_selected" else CHANGE
        verb = "Purged" if action == "purge_selected" else "Requeued"
        self._log(request, letters, flag, f"{verb} from the dead queue.")
        return done

    def _log(self, request: HttpRequest, letters: list[DeadLetter], flag: int, msg: str) -> None:
        LogEntry.objects.log_actions(
            user_id=request.user.pk, queryset=letters, action_flag=flag, change_message=msg
        )
