"""Create (if missing) a user and organization and print a new API token as the last line."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from kiln.accounts.models import Role
from kiln.accounts.services import api_token_create, membership_ensure, organization_get_or_create


class Command(BaseCommand):
    help = "Create a user and organization if missing, and print a new API token (last line)."

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True)
        parser.add_argument("--organization", required=True)
        parser.add_argument("--password", default=None, help="Set this password (for browser sign-in).")
        parser.add_argument("--role", default=Role.OWNER, choices=[r.value for r in Role])
        parser.add_argument("--name", default="cli")
        parser.add_argument("--expires-in-days", type=int, default=None)

    def handle(self, *args, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(username=options["username"])
        if options["password"]:
            user.set_password(options["password"])
            user.save()
        elif created:
            user.set_unusable_password()
            user.save()
        organization = organization_get_or_create(name=options["organization"])
        membership_ensure(user=user, organization=organization, role=options["role"])
        _, secret = api_token_create(
            user=user, organization=organization, name=options["name"], expires_in_days=options["expires_in_days"]
        )
        self.stderr.write(f"Token for {user.username} in organization {organization.name} (shown once):")
        self.stdout.write(secret)
