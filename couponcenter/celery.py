import os

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "couponcenter.settings")

app = Celery("couponcenter")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Prometheus multiprocess mode (PROMETHEUS_MULTIPROC_DIR): each prefork child writes its own
# files, which the web's /metrics adds up; a child that exits is marked dead so its live gauges go.
@worker_process_init.connect
def _metrics_child_started(**kwargs) -> None:
    import reminders.metrics  # noqa: F401  (the child's counters exist from its first moment)


@worker_process_shutdown.connect
def _metrics_child_exited(pid: int | None = None, **kwargs) -> None:
    from couponcenter.monitoring import mark_process_dead

    mark_process_dead(pid)
