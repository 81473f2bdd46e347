import os

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_process_init, worker_process_shutdown
from django.db import close_old_connections

from couponcenter.core.metrics import mark_process_dead
from couponcenter.core.process import tune_gc

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "couponcenter.settings")

app = Celery("couponcenter")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Celery's Django fixup closes every database connection before and after every task unless this
# is set, so each delivery task would pay for a new PostgreSQL connection (about 10 ms, more than
# the delivery itself). Instead connections live as Django's own request cycle keeps them:
# ``close_old_connections`` around each task honours CONN_MAX_AGE and drops broken ones.
app.conf.CELERY_DB_REUSE_MAX = 2**31


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(task=None, **kwargs) -> None:
    if task is not None and getattr(task.request, "is_eager", False):
        return  # run in the caller's process: its connection is the caller's to manage
    close_old_connections()


# Prometheus multiprocess mode (PROMETHEUS_MULTIPROC_DIR): each prefork child writes its own
# files, which the web's /metrics adds up; a child that exits is marked dead so its live gauges go.
@worker_process_shutdown.connect
def _metrics_child_exited(pid: int | None = None, **kwargs) -> None:
    mark_process_dead(pid)


@worker_process_init.connect
def _tune_child_gc(**kwargs) -> None:
    tune_gc()  # a child delivers 2,000-reminder batches for its whole life (see tune_gc)
