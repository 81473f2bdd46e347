from django.urls import path

import couponcenter.api.urls  # noqa: F401  (registers the "id" path converter)
from reminders.api import notifications, ops, subscriptions, timeouts

urlpatterns = [
    path("timeouts/", timeouts.TimeoutJobCreateApi.as_view(), name="timeout-create"),
    path("timeouts/<id:job_id>/", timeouts.TimeoutJobDetailApi.as_view(), name="timeout-detail"),
    path(
        "users/<id:user_id>/reminders/",
        subscriptions.SubscriptionListApi.as_view(),
        name="user-reminder-list",
    ),
    path(
        "users/<id:user_id>/reminders/<id:coupon_id>/",
        subscriptions.SubscriptionDetailApi.as_view(),
        name="user-reminder-detail",
    ),
    path(
        "users/<id:user_id>/notifications/",
        notifications.NotificationListApi.as_view(),
        name="user-notification-list",
    ),
    path("ops/backlog/", ops.BacklogApi.as_view(), name="ops-backlog"),
    path("ops/dead-letters/", ops.DeadLetterListApi.as_view(), name="ops-dead-letters"),
    path(
        "ops/dead-letters/requeue/",
        ops.DeadLetterRequeueApi.as_view(),
        name="ops-dead-letters-requeue",
    ),
    path("ops/config/", ops.ConfigApi.as_view(), name="ops-config"),
]
