from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "kiln.fleet"
    label = "fleet"
