"""OpenAPI pieces shared by the views: the typed path parameters.

The URLs use a custom ``id`` converter (1-18 digits, so an id never overflows a BIGINT); the schema
would otherwise describe those parameters as patterned strings. A path that does not match is a
404, so every operation with ids in its path documents one.
"""

from drf_spectacular.utils import OpenApiParameter

# What the ``id`` converter in urls.py matches; anything else is a 404.
ID_SCHEMA = {"type": "integer", "format": "int64", "minimum": 0, "maximum": 10**18 - 1}


def _id(name: str, description: str) -> OpenApiParameter:
    return OpenApiParameter(name, ID_SCHEMA, OpenApiParameter.PATH, description=description)


COUPON_ID = _id("coupon_id", "Coupon id.")
USER_ID = _id("user_id", "External end-user id.")
USER_COUPON_ID = _id("user_coupon_id", "Id of the user's claimed coupon.")


# Business rules across fields that a JSON Schema can state, per request component. Only ``not``
# (``anyOf``/``oneOf`` on an object turn it into a union in generated clients); the rest of the
# rule goes in the description.
CROSS_FIELD_RULES = {
    "CouponInputRequest": {
        "not": {"required": ["expires_at", "valid_for"]},
        "description": "Give exactly one of `expires_at` (a fixed end) and `valid_for` (counted "
        "from each claim). `claim_closes_at` and `expires_at` must be after `claim_opens_at` and "
        "in the future.",
    },
    "PatchedCouponInputRequest": {"not": {"required": ["expires_at", "valid_for"]}},
}


def add_cross_field_rules(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: ``CROSS_FIELD_RULES`` into the components."""
    schemas = result.get("components", {}).get("schemas", {})
    for name, rules in CROSS_FIELD_RULES.items():
        if name in schemas:
            schemas[name].update(rules)
    return result
