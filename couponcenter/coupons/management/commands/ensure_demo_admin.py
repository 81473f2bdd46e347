"""The demo superuser for ``make run``: made once, its password kept across runs.

The generated password is kept in ``var/admin-password`` (mode 0600, never committed) so the
welcome box can show it on every run; ``--reset`` (``make admin-password``) makes a new one.
"""

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


def password_file() -> Path:
    return Path(settings.VAR_DIR) / "admin-password"


def known_password(user) -> str | None:
    """The kept password, if it is still the user's (someone may have changed it since)."""
    try:
        password = password_file().read_text().strip()
    except OSError:
        return None
    return password if password and user.check_password(password) else None


class Command(BaseCommand):
    help = (
        "Create the demo superuser 'admin' with a generated password, once; later runs keep it. "
        "--reset sets a new one."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--reset", action="store_true", help="set a new password")
        parser.add_argument("--url", default="http://127.0.0.1:8000/admin/")

    def handle(self, *args, username: str, reset: bool, url: str, **options):
        user, created = get_user_model().objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        if not (user.is_staff and user.is_superuser and user.is_active):
            user.is_staff = user.is_superuser = user.is_active = True
            user.save(update_fields=["is_staff", "is_superuser", "is_active"])
        if created or reset or not user.has_usable_password():
            password = secrets.token_urlsafe(12)
            user.set_password(password)
            user.save(update_fields=["password"])
            path = password_file()
            path.write_text(password + "\n")
            os.chmod(path, 0o600)
            verb = "created" if created else "reset"
            self.stdout.write(self.style.SUCCESS(f"Demo admin {verb}: {username} / {password}"))
        else:
            shown = known_password(user) or "(unchanged; `make admin-password` sets a new one)"
            self.stdout.write(f"Demo admin kept: {username} / {shown}")
        self.stdout.write(f"Admin: {url}")
