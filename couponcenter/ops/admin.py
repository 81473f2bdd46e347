"""The console's place in the admin: the index page links it above the app list. The console's
pages are ``couponcenter.ops.views``; the apps' own admins stay in their apps."""

from django.contrib import admin

admin.site.index_template = "admin/ops/console_index.html"
