"""The reminders admin, which is also the operations console (issue 5).

- ``domain``: subscriptions, timeout jobs, notifications (built for tens of millions of rows);
- ``config``: the live ``ReminderSettings`` row, with which running workers picked it up;
- ``deadletters``: the engine's dead queues as an unmanaged model (as django-rq does for queues);
- ``console``: the overview page at ``/admin/console/``, linked from the admin index.

Pages read through ``reminders.console`` (selectors) and write through ``reminders.services``.
"""

from django.contrib import admin

from . import config, console, deadletters, domain  # noqa: F401  (registers the admins)

# AdminSite hook: the index page gets a link to the console above the app list.
admin.site.index_template = "admin/reminders/console_index.html"
