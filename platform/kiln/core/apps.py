from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.urls import register_converter

from .converters import IdConverter
from .metrics import count_queries
from .revocations import connect_signals


class CoreConfig(AppConfig):
    name = "kiln.core"
    label = "core"

    def ready(self):
        # Every URLconf says <id:pk>; registered before the first request loads them.
        register_converter(IdConverter, "id")
        # A revocation anywhere reaches every server process's token caches at once.
        connect_signals()
        # kiln_db_queries on /metrics: what a fleet costs the database (benchmarks/fleet_load.py reads it).
        connection_created.connect(count_queries, dispatch_uid="kiln-count-queries")
