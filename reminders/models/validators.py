"""The validators the reminders models share. The migrations name them by their path through the
package (``reminders.models._power_of_two``), so ``reminders.models`` imports them."""

from django.conf import settings
from django.core.exceptions import ValidationError

from reminders.engine.knobs import is_power_of_two


def _power_of_two(value: int) -> None:
    if not is_power_of_two(value):
        raise ValidationError(f"{value} is not a power of two (1, 2, 4, 8, ...).")


def _within_attribute_max(value: int) -> None:
    if value > settings.TIMEOUT_ATTRIBUTE_MAX_BYTES:
        raise ValidationError(
            f"At most {settings.TIMEOUT_ATTRIBUTE_MAX_BYTES:,}, the service's hard limit "
            "(TIMEOUT_ATTRIBUTE_MAX_BYTES)."
        )
