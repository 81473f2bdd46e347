from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import pre_save

from couponcenter.core import tracing
from couponcenter.core.security import log_lockout
from couponcenter.core.urgency import register_urgent_path
from couponcenter.coupons.claim_latency import claims_readings


class CouponCenterConfig(AppConfig):
    name = "couponcenter.coupons"
    label = "couponcenter"  # keys its tables, migration history and permissions
    verbose_name = "Coupons"

    def ready(self) -> None:
        # django-axes' signals module imports its models: loaded once the registry is ready.
        from axes.signals import user_locked_out

        user_locked_out.connect(log_lockout, dispatch_uid="couponcenter.log_lockout")
        # The token authentication imports DRF's Token model: loaded once the registry is ready.
        from couponcenter.core.api.authentication import revoke_tokens_on_credential_change

        pre_save.connect(
            revoke_tokens_on_credential_change,
            sender=settings.AUTH_USER_MODEL,
            dispatch_uid="couponcenter.revoke_tokens_on_credential_change",
        )
        # Traces to the OTLP endpoint when one is configured (else nothing is installed).
        tracing.setup()
        # The claims' answer times, for the background work that yields to them.
        register_urgent_path("claims", claims_readings)
