"""Show which OS confinements this host's kernel grants the sandbox, and prove them with escape attempts."""
from __future__ import annotations

import json

from django.conf import settings
from django.core.management.base import BaseCommand

from workers.sandbox.report import describe
from workers.sandbox.runner import probe


class Command(BaseCommand):
    help = "Start a sandboxed child, report what the kernel granted it and which escapes it stopped (exit 1 if one got through)."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the raw report")

    def handle(self, *args, **options):
        report = probe(uid=settings.SANDBOX_UID)
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(describe(report, allow_unconfined=settings.SANDBOX_ALLOW_UNCONFINED))
        if any(not outcome.startswith("refused") for outcome in report["escapes"].values()):
            raise SystemExit(1)
