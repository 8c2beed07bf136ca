from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "kiln.registry"
    label = "registry"
