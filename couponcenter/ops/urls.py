"""``/api/ops/``: the operations API (staff only)."""

from django.urls import path

from couponcenter.ops import api as ops

urlpatterns = [
    path("ops/backlog/", ops.BacklogApi.as_view(), name="ops-backlog"),
    path("ops/dead-letters/", ops.DeadLetterListApi.as_view(), name="ops-dead-letters"),
    path(
        "ops/dead-letters/requeue/",
        ops.DeadLetterRequeueApi.as_view(),
        name="ops-dead-letters-requeue",
    ),
    path("ops/config/", ops.ConfigApi.as_view(), name="ops-config"),
]
