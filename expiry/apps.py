from django.apps import AppConfig

from couponcenter.core import metrics as core_metrics


class ExpiryConfig(AppConfig):
    name = "expiry"
    verbose_name = "Mass expiry"

    def ready(self) -> None:
        # Imports models, so Django's app loading needs it here, once the registry is ready.
        from expiry import metrics

        core_metrics.register_state_source("database", metrics.expiry_gauges)
