import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or reset) the demo superuser 'admin' with a freshly generated password."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--url", default="http://127.0.0.1:8000/admin/")

    def handle(self, *args, username: str, url: str, **options):
        password = secrets.token_urlsafe(12)
        user, created = get_user_model().objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "created" if created else "reset"
        self.stdout.write(self.style.SUCCESS(f"Demo admin {verb}: {username} / {password}"))
        self.stdout.write(self.style.SUCCESS(f"Admin: {url}"))
