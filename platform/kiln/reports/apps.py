from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "kiln.reports"
    label = "reports"
