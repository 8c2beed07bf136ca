import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln.settings")
django.setup(set_prefix=False)

from kiln.core.asgi import KilnASGIHandler  # noqa: E402  (needs the apps set up above)

application = KilnASGIHandler()
