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
