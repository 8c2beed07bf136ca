import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln.settings")
django.setup(set_prefix=False)

from django.urls import get_resolver  # noqa: E402

from kiln.core.asgi import KilnASGIHandler  # noqa: E402  (needs the apps set up above)
from kiln.core.heap import tune_for_serving  # noqa: E402

application = KilnASGIHandler()
# Every view module (and what they import) now, while the worker boots: Django would import them in
# the first request, seconds of work that every request arriving meanwhile waited out.
get_resolver().url_patterns  # noqa: B018
# Then what booting left alive is frozen, out of every garbage collection's walk (kiln.core.heap).
tune_for_serving()
