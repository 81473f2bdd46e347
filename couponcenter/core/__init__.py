"""The shared kernel: what every app may use and what knows no app.

Redis clients, business errors, logging, middleware, the per-process TTL cache, the live-settings
scheme, the signed-POST helper, the Prometheus and health registries, the admin's paginator, the
DRF plumbing (``core.api``) and the PostgreSQL backend (``core.db``). Nothing here imports the
coupon domain, ``reminders``, ``expiry`` or ``couponcenter.ops``; the apps register their metrics
and health checks here from their ``AppConfig.ready()`` (import-linter keeps the rule:
``make lint``).
"""

__version__ = "0.1.0"
