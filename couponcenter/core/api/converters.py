"""URL path converters of the API; importing this module registers them."""

from django.urls import register_converter


class BigIntConverter:
    """Non-negative ids that fit a BIGINT: anything longer is a 404, never a database error."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(BigIntConverter, "id")
