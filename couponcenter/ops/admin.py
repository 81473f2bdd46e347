"""The console's place in the admin: the index page links it above the app list. The console's
pages are ``couponcenter.ops.views``; the apps' own admins stay in their apps."""

from django.contrib import admin

admin.site.index_template = "admin/ops/console_index.html"
admin.site.site_header = "Coupon Center"
admin.site.site_title = "Coupon Center admin"
admin.site.index_title = "Operations and data"
# "View site": the landing page (the console, the admin, the API docs, health).
admin.site.site_url = "/"
# The lists need the width at 1280 px more than a second copy of the index's app list.
admin.site.enable_nav_sidebar = False
