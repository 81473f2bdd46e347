"""Business refusals: the services raise these, the API turns them into 409 with the code."""


class BusinessError(Exception):
    """A request that is well formed but refused by a business rule."""

    code = "refused"

    def __init__(self, code: str | None = None, message: str = "", **extra: object) -> None:
        """``extra``: what a client needs to act on the refusal (e.g. ``opens_at``), answered
        beside ``code`` and ``detail``."""
        self.code = code or self.code
        self.message = message or self.code.replace("_", " ")
        self.extra = extra
        super().__init__(self.message)


class QuotaExceeded(Exception):
    """A caller over one of its quotas: the API answers 429 with ``Retry-After``. Nothing of the
    refused request was done."""

    code = "quota_exceeded"

    def __init__(self, *, quota: str, limit: int, retry_after_s: int, message: str) -> None:
        """``quota``: which one (its setting's name); ``retry_after_s``: when to try again."""
        self.quota = quota
        self.limit = limit
        self.retry_after_s = max(1, retry_after_s)
        self.message = message
        super().__init__(message)
