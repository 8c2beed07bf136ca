from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "kiln.core"
    label = "core"
