from django.core.management.base import BaseCommand, CommandError

from couponcenter.core.errors import BusinessError
from couponcenter.coupons import accounts

MAX_USER_ID = 10**18 - 1


class Command(BaseCommand):
    help = (
        "Create an API account (or update one: it keeps its token) and print its token. "
        "--user-id links it to one end user (an end user's app); --permission gives it "
        "act_for_any_user (a backend service), manage_coupons or manage_timeouts."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--user-id", type=int, help="the end user it acts for")
        parser.add_argument(
            "--permission",
            action="append",
            default=[],
            choices=sorted(accounts.ACCOUNT_PERMISSIONS),
            help="repeat for several",
        )

    def handle(self, *args, username: str, user_id: int | None, permission: list[str], **opts):
        if not username or len(username) > 150:
            raise CommandError("the username must be 1 to 150 characters")
        if user_id is not None and not 1 <= user_id <= MAX_USER_ID:
            raise CommandError(f"--user-id must be within 1..{MAX_USER_ID}, got {user_id}")
        if user_id is not None and "act_for_any_user" in permission:
            raise CommandError("an account linked to one user cannot act for any user")
        try:
            user, token, created = accounts.account_provision(
                username=username,
                end_user_id=user_id,
                permissions=tuple(permission),
                api_only=True,
            )
        except BusinessError as exc:
            raise CommandError(exc.message) from None
        held = ", ".join(accounts.account_permissions(user)) or "none"
        link = f"acts for user {user_id}" if user_id is not None else "linked to no end user"
        verb = "created" if created else "updated"
        self.stderr.write(f"{verb} {user.username}: {link}; permissions: {held}")
        self.stdout.write(token)
