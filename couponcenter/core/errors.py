"""Business refusals: the services raise these, the API turns them into 409 with the code."""


class BusinessError(Exception):
    """A request that is well formed but refused by a business rule."""

    code = "refused"

    def __init__(self, code: str | None = None, message: str = "") -> None:
        self.code = code or self.code
        self.message = message or self.code.replace("_", " ")
        super().__init__(self.message)
