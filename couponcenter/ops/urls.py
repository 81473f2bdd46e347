"""``/api/ops/``: the operations API (staff only)."""

from django.urls import path

from couponcenter.ops import api

urlpatterns = [
    path("ops/backlog/", api.BacklogApi.as_view(), name="ops-backlog"),
    path("ops/dead-letters/", api.DeadLetterListApi.as_view(), name="ops-dead-letters"),
    path(
        "ops/dead-letters/requeue/",
        api.DeadLetterRequeueApi.as_view(),
        name="ops-dead-letters-requeue",
    ),
    path("ops/config/", api.ConfigApi.as_view(), name="ops-config"),
]
