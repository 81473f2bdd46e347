from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The operations console: admin pages, charts and ``/api/ops/`` over every app's selectors.
    No models of its own; the one package that may import every app."""

    name = "couponcenter.ops"
    label = "ops"
    verbose_name = "Operations"
