"""``python manage.py send_digest``: a job that cron starts on every host and that must run on one.

In each host's crontab::

    0 7 * * * cd /srv/site && aioelect run --no-wait --conflict-exit-code 0 -- python manage.py send_digest

``aioelect run --no-wait`` runs the command only on the host that leads at
that moment and exits at once elsewhere (``--conflict-exit-code 0``: not a
failure for cron, a Kubernetes CronJob or systemd). The command reads the
leadership's fencing token from ``AIOELECT_TOKEN`` and passes it with its
writes.
"""

import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Send the daily digest (run it under aioelect run --no-wait)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=0.0, help="how long the sending takes")

    def handle(self, *args: Any, **options: Any) -> None:
        token = os.environ.get("AIOELECT_TOKEN")  # set by aioelect run: the fencing token of this leadership
        self.stdout.write(f"sending the digest with token {token}")
        time.sleep(options["seconds"])
        self.stdout.write(f"digest sent with token {token}")
