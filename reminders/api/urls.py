from django.urls import path

from couponcenter.core.api import converters  # noqa: F401  (registers the "id" path converter)
from reminders.api import notifications, subscriptions, timeout_topics, timeouts

urlpatterns = [
    path("timeout-topics/", timeout_topics.TopicListApi.as_view(), name="timeout-topic-list"),
    path(
        "timeout-topics/<str:name>/",
        timeout_topics.TopicDetailApi.as_view(),
        name="timeout-topic-detail",
    ),
    path("timeouts/", timeouts.TimeoutJobListCreateApi.as_view(), name="timeout-list"),
    path("timeouts/bulk/", timeouts.TimeoutJobBulkApi.as_view(), name="timeout-bulk"),
    path("timeouts/by-key/", timeouts.TimeoutJobByKeyApi.as_view(), name="timeout-by-key"),
    path("timeouts/<id:job_id>/", timeouts.TimeoutJobDetailApi.as_view(), name="timeout-detail"),
    path("timeouts/<id:job_id>/end/", timeouts.TimeoutJobEndApi.as_view(), name="timeout-end"),
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
    path(
        "users/<id:user_id>/notifications/read/",
        notifications.NotificationReadAllApi.as_view(),
        name="user-notification-read-all",
    ),
    path(
        "users/<id:user_id>/notifications/<id:notification_id>/read/",
        notifications.NotificationReadApi.as_view(),
        name="user-notification-read",
    ),
]
