from django.apps import AppConfig

from couponcenter.core import tracing
from couponcenter.core.security import log_lockout


class CouponCenterConfig(AppConfig):
    name = "couponcenter"
    verbose_name = "Coupons"

    def ready(self) -> None:
        # django-axes' signals module imports its models: loaded once the registry is ready.
        from axes.signals import user_locked_out

        user_locked_out.connect(log_lockout, dispatch_uid="couponcenter.log_lockout")
        # Traces to the OTLP endpoint when one is configured (else nothing is installed).
        tracing.setup()
