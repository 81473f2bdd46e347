"""The dead letters' model: a name, permissions and log entries for the admin over jobs that live
in the engine's dead queues in Redis, not in a table."""

from django.db import models


class DeadLetter(models.Model):
    """A job in an engine dead queue: lives in Redis, not in a table (``managed = False``).

    As django-rq does for its queues, the model only gives the admin a name, permissions and log
    entries; rows are built by ``reminders.selectors.dead_letters`` from the dead sorted sets, never
    queried.
    The primary key is ``"<topic>|<slot>|<job id>"``.
    """

    key = models.CharField(max_length=300, primary_key=True)
    topic = models.CharField(max_length=100)
    slot = models.PositiveIntegerField()
    job_id = models.CharField(max_length=200)
    user_id = models.BigIntegerField(null=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    died_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"

    def __str__(self) -> str:
        return f"{self.topic} slot {self.slot}: {self.job_id}"
