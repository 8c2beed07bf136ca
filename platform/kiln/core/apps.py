from django.apps import AppConfig
from django.urls import register_converter

from .converters import IdConverter


class CoreConfig(AppConfig):
    name = "kiln.core"
    label = "core"

    def ready(self):
        # Every URLconf says <id:pk>; registered before the first request loads them.
        register_converter(IdConverter, "id")
        # A revocation anywhere reaches every server process's token caches at once.
        from .revocations import connect_signals

        connect_signals()
