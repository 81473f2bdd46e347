from django.apps import AppConfig

from couponcenter.core import metrics as core_metrics
from couponcenter.core.holdback import holdback_gauges


class OpsConfig(AppConfig):
    """The operations console: admin pages, charts and ``/api/ops/`` over every app's selectors.
    No models of its own; the one package that may import every app."""

    name = "couponcenter.ops"
    label = "ops"
    verbose_name = "Operations"

    def ready(self) -> None:
        # The urgent paths and the background work held back for them, as the console shows them.
        core_metrics.register_state_source("urgency", holdback_gauges)
