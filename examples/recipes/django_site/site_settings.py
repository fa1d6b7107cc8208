"""The smallest Django settings that run a management command (no database is used)."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "for-this-example-only")
INSTALLED_APPS = ["reports"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
