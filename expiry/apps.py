from django.apps import AppConfig


class ExpiryConfig(AppConfig):
    name = "expiry"
    verbose_name = "Mass expiry"
