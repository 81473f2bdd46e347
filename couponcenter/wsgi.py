import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "couponcenter.settings")
_django = get_wsgi_application()

# Imported once Django is set up: the claim's front door (docs/claims.md) is a view's module.
from couponcenter.coupons.api.front_door import ClaimFrontDoor  # noqa: E402

application = ClaimFrontDoor(_django)
